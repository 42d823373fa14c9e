// ProjectVersion (see version.h). QLORA_VERSION is set by common/program/CMakeLists.txt.
#include "common/program/version.h"

#ifndef QLORA_VERSION
#error "QLORA_VERSION must be defined by the build (CMake project(VERSION))"
#endif

namespace qlora {

const char* ProjectVersion() { return QLORA_VERSION; }

}  // namespace qlora
