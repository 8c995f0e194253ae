# Hardware profiles and the modelled Llama module table (meshwork-simulate's inputs).
meshwork_test(compiler_hardware_profile_test LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/hardware_profile_test.cpp
  LIBS meshwork_trainer_hardware_profile)
meshwork_test(compiler_llama_skeleton_test LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/llama_skeleton_test.cpp
  LIBS meshwork_trainer_compiler)
