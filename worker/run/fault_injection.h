// A test hook: a worker that dies at a chosen point, so that tests of the coordinator's restarts
// can crash a rank exactly there. Armed only by the environment variable
// QLORA_TEST_CRASH_BEFORE_SAVE=<step>:<rank>:<marker file>, which no production setting uses:
// rank <rank> exits (status 86, as a crash would end it) just before writing its part of the
// checkpoint of <step>, once: it creates <marker file> first, and does nothing while that file
// exists, so the restarted run goes through. Other ranks may have written their parts of that
// checkpoint already: it is left without its manifest, as a crash between ranks' writes leaves it.
#pragma once

#include <memory>

#include "worker/run/training_observer.h"

namespace qlora::worker {

inline constexpr char kCrashBeforeSaveVariable[] = "QLORA_TEST_CRASH_BEFORE_SAVE";

// The observer the variable asks for, or nullptr when it is unset (or malformed, said on stderr).
std::unique_ptr<TrainingObserver> FaultInjectorFromEnvironment(int rank);

}  // namespace qlora::worker
