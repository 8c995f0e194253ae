# Hardware profiles and the meshwork-simulate tool: a plan's step time, exposed communication
# and peak memory on a cluster described by a profile (bench/profiles/*.yaml). Included from
# trainer/compiler/CMakeLists.txt after meshwork_trainer_compiler is defined.
add_library(meshwork_trainer_hardware_profile STATIC ${CMAKE_CURRENT_LIST_DIR}/hardware_profile.cpp)
target_link_libraries(meshwork_trainer_hardware_profile PUBLIC meshwork_trainer_compiler meshwork_common yaml-cpp)

add_executable(meshwork-simulate ${CMAKE_CURRENT_LIST_DIR}/simulate_main.cpp)
target_link_libraries(meshwork-simulate PRIVATE meshwork_trainer_hardware_profile meshwork_trainer_compiler yaml-cpp)
