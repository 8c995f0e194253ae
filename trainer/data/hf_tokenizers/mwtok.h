/* The C ABI of the Hugging Face tokenizers static library (src/lib.rs). Functions returning int
 * return 0 on success, 1 for bad input (file, text, argument) and 2 for an internal failure; on
 * failure *err holds a message to free with mwtok_free_string. Id arrays and strings come from
 * the library's allocator and go back to it (mwtok_free_ids, mwtok_free_string). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct MwTokenizer MwTokenizer;
typedef struct {
  uint32_t* data;
  size_t len;
} MwIds;

int mwtok_load(const char* path, MwTokenizer** out, char** err);
void mwtok_free(MwTokenizer* tok);
size_t mwtok_vocab_size(const MwTokenizer* tok);
int mwtok_token_to_id(const MwTokenizer* tok, const char* token, uint32_t* id);
int mwtok_is_special(const MwTokenizer* tok, uint32_t id);
int mwtok_encode(const MwTokenizer* tok, const uint8_t* text, size_t len, int add_special_tokens,
                 MwIds* out, char** err);
/* *bad_index: the text that is not UTF-8, or SIZE_MAX when the library failed on the batch. */
int mwtok_encode_batch(const MwTokenizer* tok, const uint8_t* const* texts, const size_t* lens,
                       size_t n, int add_special_tokens, MwIds* out, size_t* bad_index, char** err);
int mwtok_decode(const MwTokenizer* tok, const uint32_t* ids, size_t n, int skip_special_tokens,
                 char** out, char** err);
/* A byte-level BPE with Llama 3's pre-tokenizer trained on n UTF-8 texts (vocab_size ids, the
 * specials first), written to out_path as a tokenizer.json. */
int mwtok_train_bpe(const uint8_t* const* texts, const size_t* lens, size_t n, size_t vocab_size,
                    const char* const* specials, size_t n_specials, const char* out_path, char** err);
void mwtok_free_ids(MwIds ids);
void mwtok_free_string(char* s);

#ifdef __cplusplus
}
#endif
