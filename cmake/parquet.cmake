# Parquet input for prepare-data (trainer/data/parquet_module.h, docs/data.md "Parquet"): Apache
# Arrow's C++ library (libarrow, libparquet and their headers) as PyPI's pyarrow wheel ships it,
# installed by scripts/setup.sh into .meshwork/tools/arrow (Debian 12 does not package Arrow).
# Built into libmeshwork_parquet.so, which meshwork-train opens on first use; Arrow's headers need
# C++20, so only the module is compiled with it.
#
# MESHWORK_ARROW_DIR: the wheel's pyarrow/ folder (include/, libarrow.so.N, libparquet.so.N).
# AUTO builds the module when that folder is there and says so when it is not; ON fails the
# configure instead. Without it a Parquet input is refused with the reason (exit 5).
set(MESHWORK_WITH_PARQUET "AUTO" CACHE STRING "Parquet input (needs pyarrow's Arrow C++ libraries): AUTO, ON or OFF")
set_property(CACHE MESHWORK_WITH_PARQUET PROPERTY STRINGS AUTO ON OFF)
set(MESHWORK_ARROW_DIR "${PROJECT_SOURCE_DIR}/.meshwork/tools/arrow/pyarrow" CACHE PATH
    "pyarrow's folder holding Arrow's C++ headers and libraries")

set(MESHWORK_HAVE_PARQUET OFF)
if(NOT MESHWORK_WITH_PARQUET STREQUAL "OFF")
  file(GLOB _arrow_lib "${MESHWORK_ARROW_DIR}/libarrow.so.[0-9]*")
  file(GLOB _parquet_lib "${MESHWORK_ARROW_DIR}/libparquet.so.[0-9]*")
  if(_arrow_lib AND _parquet_lib AND EXISTS "${MESHWORK_ARROW_DIR}/include/parquet/arrow/reader.h")
    set(MESHWORK_HAVE_PARQUET ON)
    list(GET _arrow_lib 0 MESHWORK_ARROW_LIBRARY)
    list(GET _parquet_lib 0 MESHWORK_PARQUET_LIBRARY)
    message(STATUS "Parquet: ON (${MESHWORK_PARQUET_LIBRARY})")
  elseif(MESHWORK_WITH_PARQUET STREQUAL "ON")
    message(FATAL_ERROR "MESHWORK_WITH_PARQUET=ON but ${MESHWORK_ARROW_DIR} holds no Arrow C++ libraries "
                        "(scripts/setup.sh installs them from the pyarrow wheel)")
  else()
    message(STATUS "Parquet: OFF (no Arrow C++ libraries in ${MESHWORK_ARROW_DIR}); Parquet inputs will be refused")
  endif()
endif()
