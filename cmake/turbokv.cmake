# Helpers shared by the per-area CMakeLists.txt files.

# Marks sources that use AVX2/FMA/F16C intrinsics. They are only entered after a runtime
# CPU check (see src/core/cpu.h), so the rest of the binary runs on any x86-64.
function(turbokv_avx2_sources)
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
    set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c")
  endif()
endfunction()

# Marks sources that use AVX-512 (F, BW, VL, DQ) on top of AVX2/FMA/F16C; entered only after
# cpu_has_avx512().
function(turbokv_avx512_sources)
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
    set_source_files_properties(
      ${ARGN} PROPERTIES COMPILE_OPTIONS
                         "-mavx2;-mfma;-mf16c;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq")
  endif()
endfunction()

# turbokv_add_subfolders(dir): add_subdirectory for every folder of dir that has a
# CMakeLists.txt (tests/<area>/, bench/<area>/).
function(turbokv_add_subfolders dir)
  file(GLOB folders LIST_DIRECTORIES true "${dir}/*")
  foreach(folder ${folders})
    if(EXISTS "${folder}/CMakeLists.txt")
      add_subdirectory(${folder})
    endif()
  endforeach()
endfunction()

# turbokv_test(NAME name SOURCES a.cc b.cc DEPS lib1 lib2)
# One GoogleTest executable; every TEST becomes a ctest entry labelled "cxx". Tests find the
# repo (and its fixtures under tests/fixtures) through TURBOKV_SOURCE_DIR. The target
# turbokv_cxx_tests builds every such executable (and nothing else: the sanitizer run of
# scripts/test.sh).
function(turbokv_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;DEPS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} GTest::gtest GTest::gtest_main)
  target_include_directories(${T_NAME} PRIVATE ${CMAKE_SOURCE_DIR})
  target_compile_definitions(${T_NAME} PRIVATE TURBOKV_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600 LABELS cxx)
  turbokv_add_to_cxx_tests(${T_NAME})
endfunction()

# turbokv_add_to_cxx_tests(target): makes the target turbokv_cxx_tests build it too.
function(turbokv_add_to_cxx_tests target)
  if(NOT TARGET turbokv_cxx_tests)
    add_custom_target(turbokv_cxx_tests)
  endif()
  add_dependencies(turbokv_cxx_tests ${target})
endfunction()

# turbokv_cli_pytest(NAME name SCRIPT test_x.py)
# A pytest file that drives the built `turbokv` binary, run with Debian's /usr/bin/python3
# (which has pytest); it finds the repo through TURBOKV_SOURCE_DIR and the binary through
# TURBOKV_BINARY.
function(turbokv_cli_pytest)
  cmake_parse_arguments(T "" "NAME;SCRIPT" "" ${ARGN})
  add_test(NAME ${T_NAME}
           COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_SOURCE_DIR}/${T_SCRIPT})
  set_tests_properties(${T_NAME} PROPERTIES
    ENVIRONMENT "TURBOKV_SOURCE_DIR=${CMAKE_SOURCE_DIR};TURBOKV_BINARY=$<TARGET_FILE:turbokv>"
    TIMEOUT 600)
endfunction()
