# Sanitizer and libFuzzer instrumentation for every target of the build (clang; the torch-free
# build of scripts/fuzz_and_sanitize.sh uses both in one build folder):
#   QLORA_SANITIZE=address,undefined  compiles and links everything with -fsanitize=<list>, frame
#       pointers and line tables kept for readable stacks, and any UBSan report fatal
#       (-fno-sanitize-recover).
#   QLORA_FUZZ=ON  adds libFuzzer's coverage instrumentation to every object
#       (-fsanitize=fuzzer-no-link, harmless in the test binaries) and builds tests/fuzz, whose
#       targets alone link libFuzzer's main (-fsanitize=fuzzer).
if(QLORA_SANITIZE)
  add_compile_options(-fsanitize=${QLORA_SANITIZE} -fno-omit-frame-pointer -gline-tables-only)
  add_link_options(-fsanitize=${QLORA_SANITIZE})
  if(QLORA_SANITIZE MATCHES "undefined")
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
endif()
if(QLORA_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "QLORA_FUZZ=ON needs clang (libFuzzer); configure with CXX=clang++")
  endif()
  if(NOT QLORA_TORCH_FREE_ONLY)
    message(FATAL_ERROR "QLORA_FUZZ=ON needs QLORA_TORCH_FREE_ONLY=ON")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
message(STATUS "qlora: sanitizers '${QLORA_SANITIZE}', fuzz targets ${QLORA_FUZZ}")
