// The project's version, from CMake's project(VERSION) (the one place it is written): every
// binary's --version prints it.
#pragma once

namespace qlora {

// "0.1.0": CMake's PROJECT_VERSION, compiled into version.cc alone.
const char* ProjectVersion();

}  // namespace qlora
