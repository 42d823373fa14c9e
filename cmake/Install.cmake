# `cmake --install BUILD --prefix PREFIX` lays the service out as it runs (included last by the
# top CMakeLists.txt, once every target exists):
#   PREFIX/bin/qloractl, qlora-coordinator, qlora-worker, qlora-make-tiny-model, qlora-export-gguf
#   PREFIX/bin/qlora_ray_launcher.py   beside qlora-worker: the coordinator's default
#                                      --ray-launcher-script, as qlora-worker is its default
#                                      --worker-binary (beside qlora-coordinator)
#   PREFIX/lib/libqlora_spm.so         the SentencePiece module; the worker looks in ../lib from
#                                      its own folder (worker/data/spm_model.cc)
# The installed programs find their libraries through RUNPATH: $ORIGIN/../lib, then every folder
# they were linked against outside the build tree (LibTorch's cached lib folder among them). A
# tree copied to another machine (deploy/Dockerfile) puts LibTorch on LD_LIBRARY_PATH instead.
# Plain bin/ and lib/ (not GNUInstallDirs' lib/<multiarch> under /usr): the worker looks in ../lib.

set(qlora_programs qloractl qlora-coordinator)
if(NOT QLORA_TORCH_FREE_ONLY)
  list(APPEND qlora_programs qlora-worker qlora-make-tiny-model qlora-export-gguf)
endif()
set_target_properties(${qlora_programs} PROPERTIES
  INSTALL_RPATH "$ORIGIN/../lib" INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS ${qlora_programs} RUNTIME DESTINATION bin)
install(TARGETS qlora_spm LIBRARY DESTINATION lib)
install(PROGRAMS ${PROJECT_SOURCE_DIR}/deploy/ray/qlora_ray_launcher.py DESTINATION bin)
