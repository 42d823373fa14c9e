# Finds every third-party dependency once and exposes it as an imported target:
#   gRPC::grpc++ protobuf::libprotobuf absl::* yaml-cpp SQLite::SQLite3 GTest::gtest gloo
#   nlohmann_json::nlohmann_json, qlora::parquet (Arrow/Parquet C++), prometheus-cpp::core,
#   torch (LibTorch from the pinned wheel, see scripts/setup.sh),
#   and CUDA when QLORA_CUDA allows it. QLORA_TORCH_FREE_ONLY needs neither Gloo, CUDA nor torch.
if(QLORA_DEPS_PREFIX)
  list(PREPEND CMAKE_PREFIX_PATH "${QLORA_DEPS_PREFIX}")
endif()

find_package(Threads REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(yaml-cpp CONFIG REQUIRED)
find_package(SQLite3 REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
# The coordinator's metrics (coordinator/http): prometheus-cpp for the metric types and the text
# format. Its exposer (civetweb, thread per connection) is not used: the port's own event-driven
# server (coordinator/http/http_server.cc) keeps slow clients from holding threads.
find_package(prometheus-cpp CONFIG REQUIRED)
find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin HINTS "${QLORA_DEPS_PREFIX}/bin" REQUIRED)
if(QLORA_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()

# Arrow/Parquet C++ from the pinned pyarrow wheel (scripts/setup.sh unpacks it into a versioned
# cache; scripts/build.sh sets QLORA_ARROW_ROOT). The wheel has no CMake package files, so the
# target is made here. Arrow's headers need C++20: only common/dataset/parquet_reader.cc
# includes them (see common/dataset/CMakeLists.txt).
set(QLORA_ARROW_ROOT "$ENV{QLORA_ARROW_ROOT}" CACHE PATH "Arrow/Parquet C++ root (include/, lib/)")
if(NOT QLORA_ARROW_ROOT AND DEFINED ENV{QLORA_ARROW_ROOT})
  set(QLORA_ARROW_ROOT "$ENV{QLORA_ARROW_ROOT}")
endif()
find_path(QLORA_ARROW_INCLUDE_DIR parquet/arrow/reader.h
  HINTS "${QLORA_ARROW_ROOT}/include" NO_DEFAULT_PATH REQUIRED)
find_library(QLORA_ARROW_LIBRARY arrow HINTS "${QLORA_ARROW_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)
find_library(QLORA_PARQUET_LIBRARY parquet HINTS "${QLORA_ARROW_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)
add_library(qlora_parquet_libs INTERFACE)
add_library(qlora::parquet ALIAS qlora_parquet_libs)
target_link_libraries(qlora_parquet_libs INTERFACE ${QLORA_PARQUET_LIBRARY} ${QLORA_ARROW_LIBRARY})
target_include_directories(qlora_parquet_libs SYSTEM INTERFACE ${QLORA_ARROW_INCLUDE_DIR})
message(STATUS "qlora: Arrow/Parquet C++ from ${QLORA_ARROW_INCLUDE_DIR}")

set(QLORA_HAVE_CUDA OFF)
if(QLORA_TORCH_FREE_ONLY)
  message(STATUS "qlora: torch-free build (no Gloo, CUDA or LibTorch)")
  return()
endif()
find_package(Gloo CONFIG REQUIRED)

# CUDA: decided before Torch so that Torch's own CUDA detection agrees with ours.
if(NOT QLORA_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES ${QLORA_CUDA_ARCHITECTURES})
    set(CMAKE_CUDA_STANDARD 17)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(QLORA_HAVE_CUDA ON)
  elseif(QLORA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "QLORA_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "qlora: CUDA kernels ${QLORA_HAVE_CUDA}")

# LibTorch: CMAKE_PREFIX_PATH names it (scripts/build.sh passes the cache folder). Torch's CMake
# hands nvcc the architectures of TORCH_CUDA_ARCH_LIST (its "9.0" form) and clears
# CMAKE_CUDA_ARCHITECTURES, so that list is derived from QLORA_CUDA_ARCHITECTURES ("90" -> "9.0",
# "90a" -> "9.0a"): the option is what the kernels are built for. The kernels' programmatic
# dependent launch (kernels/dependent_launch.cuh) needs griddepcontrol in every architecture
# built (sm_90 and later): a kernel built for an older one (an H200 JIT-compiles a build's
# compute_80 code where it has no sm_90 code) could not wait for the kernel before it.
set(TORCH_CUDA_ARCH_LIST "")
set(QLORA_DEPENDENT_LAUNCH 0)
if(QLORA_CUDA_ARCHITECTURES)
  set(QLORA_DEPENDENT_LAUNCH 1)
endif()
foreach(arch IN LISTS QLORA_CUDA_ARCHITECTURES)
  string(REGEX REPLACE "^([0-9]+)([0-9])([a-z]?)$" "\\1.\\2\\3" torch_arch "${arch}")
  list(APPEND TORCH_CUDA_ARCH_LIST "${torch_arch}")
  string(REGEX MATCH "^[0-9]+" arch_number "${arch}")
  if(NOT arch_number OR arch_number LESS 90)
    set(QLORA_DEPENDENT_LAUNCH 0)
  endif()
endforeach()
find_package(Torch REQUIRED)
# Torch's flags carry -D_GLIBCXX_USE_CXX11_ABI=1, which matches the system libraries.
add_library(qlora_torch INTERFACE)
target_link_libraries(qlora_torch INTERFACE ${TORCH_LIBRARIES})
target_include_directories(qlora_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
