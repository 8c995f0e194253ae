# Tokenizers for prepare-data and tokenize (trainer/data/tokenizer.h, docs/data.md "Tokenizers"):
#
# - Hugging Face tokenizer.json through the `tokenizers` crate from crates.io, built by cargo into
#   a static library with a C ABI (trainer/data/hf_tokenizers/). The crates are fetched at configure
#   time (cargo fetch --locked: the versions in Cargo.lock, nothing newer); the objects go to
#   .meshwork/cargo-target, shared by the CPU and CUDA builds of one checkout.
# - SentencePiece .model files through Debian's libsentencepiece, inside a module of its own that
#   meshwork-train loads with deep binding (trainer/data/spm_module.h says why).
#
# AUTO builds each where its tool or library is present and says so where it is not; ON fails the
# configure instead. Without them prepare-data still runs with the byte-level vocabulary, and a
# tokenizer file is refused with the reason (exit 5).
set(MESHWORK_WITH_HF_TOKENIZERS "AUTO" CACHE STRING "Hugging Face tokenizers (needs cargo): AUTO, ON or OFF")
set_property(CACHE MESHWORK_WITH_HF_TOKENIZERS PROPERTY STRINGS AUTO ON OFF)
set(MESHWORK_WITH_SENTENCEPIECE "AUTO" CACHE STRING "SentencePiece models (needs libsentencepiece-dev): AUTO, ON or OFF")
set_property(CACHE MESHWORK_WITH_SENTENCEPIECE PROPERTY STRINGS AUTO ON OFF)

set(MESHWORK_HAVE_HF_TOKENIZERS OFF)
if(NOT MESHWORK_WITH_HF_TOKENIZERS STREQUAL "OFF")
  set(_crate "${PROJECT_SOURCE_DIR}/trainer/data/hf_tokenizers")
  find_program(MESHWORK_CARGO cargo HINTS "$ENV{CARGO_HOME}/bin" "$ENV{HOME}/.cargo/bin")
  set(_why "")
  if(NOT MESHWORK_CARGO)
    set(_why "no cargo on PATH or in ~/.cargo/bin")
  else()
    execute_process(COMMAND "${MESHWORK_CARGO}" fetch --locked --manifest-path "${_crate}/Cargo.toml"
                    RESULT_VARIABLE _fetch OUTPUT_VARIABLE _fetch_out ERROR_VARIABLE _fetch_out)
    if(NOT _fetch EQUAL 0)
      set(_why "cargo fetch failed (no crates.io and no cached crates?): ${_fetch_out}")
    endif()
  endif()
  if(_why STREQUAL "")
    set(MESHWORK_HAVE_HF_TOKENIZERS ON)
    set(_target_dir "${PROJECT_SOURCE_DIR}/.meshwork/cargo-target")
    set(_lib "${_target_dir}/release/libmeshwork_hf_tokenizers.a")
    add_custom_command(
      OUTPUT "${_lib}"
      COMMAND "${CMAKE_COMMAND}" -E env "CARGO_TARGET_DIR=${_target_dir}"
              "${MESHWORK_CARGO}" build --release --locked --quiet --manifest-path "${_crate}/Cargo.toml"
      DEPENDS "${_crate}/Cargo.toml" "${_crate}/Cargo.lock" "${_crate}/src/lib.rs"
      COMMENT "Building the Hugging Face tokenizers library (cargo)"
      USES_TERMINAL)
    add_custom_target(meshwork_hf_tokenizers_cargo DEPENDS "${_lib}")
    add_library(meshwork_hf_tokenizers INTERFACE)
    # Rust's standard library needs libdl, libm and threads from the C side.
    target_link_libraries(meshwork_hf_tokenizers INTERFACE "${_lib}" Threads::Threads ${CMAKE_DL_LIBS} m)
    add_dependencies(meshwork_hf_tokenizers meshwork_hf_tokenizers_cargo)
    message(STATUS "Hugging Face tokenizers: ON (${MESHWORK_CARGO})")
  elseif(MESHWORK_WITH_HF_TOKENIZERS STREQUAL "ON")
    message(FATAL_ERROR "MESHWORK_WITH_HF_TOKENIZERS=ON but ${_why}")
  else()
    message(STATUS "Hugging Face tokenizers: OFF (${_why}); tokenizer.json files will be refused")
  endif()
endif()

set(MESHWORK_HAVE_SENTENCEPIECE OFF)
if(NOT MESHWORK_WITH_SENTENCEPIECE STREQUAL "OFF")
  find_path(MESHWORK_SPM_INCLUDE sentencepiece_processor.h)
  find_library(MESHWORK_SPM_LIBRARY sentencepiece)
  if(MESHWORK_SPM_INCLUDE AND MESHWORK_SPM_LIBRARY)
    set(MESHWORK_HAVE_SENTENCEPIECE ON)
    message(STATUS "SentencePiece: ON (${MESHWORK_SPM_LIBRARY})")
  elseif(MESHWORK_WITH_SENTENCEPIECE STREQUAL "ON")
    message(FATAL_ERROR "MESHWORK_WITH_SENTENCEPIECE=ON but libsentencepiece-dev is not installed")
  else()
    message(STATUS "SentencePiece: OFF (no libsentencepiece-dev); .model files will be refused")
  endif()
endif()
