//! A C ABI over Hugging Face's `tokenizers` crate for meshwork-train (trainer/data/tokenizer.cpp).
//!
//! Every function returns a status (0 ok, else an error whose message the caller frees with
//! `mwtok_free_string`) or a plain value; nothing here unwinds into C++: a panic inside the crate
//! is caught at the boundary and returned as an error. Buffers this library allocates are freed by
//! this library (`mwtok_free_ids`, `mwtok_free_string`), never by the C++ allocator.

use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use tokenizers::Tokenizer;

pub struct MwTokenizer {
    inner: Tokenizer,
    // One past the largest id (the model's vocabulary and the added tokens): ids need not be
    // dense, so the count of tokens is not a bound.
    id_bound: usize,
}

/// An array of token ids owned by this library.
#[repr(C)]
pub struct MwIds {
    pub data: *mut u32,
    pub len: usize,
}

const OK: i32 = 0;
const ERR_INPUT: i32 = 1; // the file, the text or an argument is bad
const ERR_INTERNAL: i32 = 2; // the crate failed or panicked

fn set_error(err: *mut *mut c_char, message: String) {
    if err.is_null() {
        return;
    }
    // An interior NUL cannot be carried by a C string; it would only come from the input's text.
    let clean = message.replace('\0', "\\0");
    unsafe { *err = CString::new(clean).map(CString::into_raw).unwrap_or(ptr::null_mut()) };
}

fn guarded<F: FnOnce() -> Result<(), (i32, String)>>(err: *mut *mut c_char, f: F) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => OK,
        Ok(Err((code, message))) => {
            set_error(err, message);
            code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            set_error(err, format!("the tokenizers library panicked: {what}"));
            ERR_INTERNAL
        }
    }
}

unsafe fn utf8<'a>(text: *const u8, len: usize) -> Result<&'a str, (i32, String)> {
    let bytes: &[u8] = if len == 0 { &[] } else { std::slice::from_raw_parts(text, len) };
    std::str::from_utf8(bytes).map_err(|e| {
        (ERR_INPUT, format!("invalid UTF-8 at byte offset {}", e.valid_up_to()))
    })
}

fn into_ids(ids: &[u32]) -> MwIds {
    let boxed: Box<[u32]> = ids.to_vec().into_boxed_slice();
    let len = boxed.len();
    let data = Box::into_raw(boxed) as *mut u32;
    MwIds { data, len }
}

/// Loads a `tokenizer.json`. Truncation and padding settings in the file are dropped: a document
/// is tokenized whole, as the Python package does once `no_truncation()` and `no_padding()` are set.
#[no_mangle]
pub unsafe extern "C" fn mwtok_load(path: *const c_char, out: *mut *mut MwTokenizer, err: *mut *mut c_char) -> i32 {
    guarded(err, || {
        let path = CStr::from_ptr(path).to_string_lossy().into_owned();
        let mut tok = Tokenizer::from_file(&path).map_err(|e| (ERR_INPUT, e.to_string()))?;
        tok.with_truncation(None).map_err(|e| (ERR_INTERNAL, e.to_string()))?;
        tok.with_padding(None);
        let id_bound = tok.get_vocab(true).values().map(|&id| id as usize + 1).max().unwrap_or(0);
        *out = Box::into_raw(Box::new(MwTokenizer { inner: tok, id_bound }));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn mwtok_free(tok: *mut MwTokenizer) {
    if !tok.is_null() {
        drop(Box::from_raw(tok));
    }
}

/// One past the largest id the tokenizer can emit (the model's vocabulary and the added tokens).
#[no_mangle]
pub unsafe extern "C" fn mwtok_vocab_size(tok: *const MwTokenizer) -> usize {
    (*tok).id_bound
}

/// 1 and the id in *id when `token` is in the vocabulary (added tokens included), else 0.
#[no_mangle]
pub unsafe extern "C" fn mwtok_token_to_id(tok: *const MwTokenizer, token: *const c_char, id: *mut u32) -> i32 {
    let token = CStr::from_ptr(token).to_string_lossy();
    match (*tok).inner.token_to_id(&token) {
        Some(found) => {
            *id = found;
            1
        }
        None => 0,
    }
}

/// 1 when `id` is an added token marked special (`<|begin_of_text|>`, `<s>`), else 0.
#[no_mangle]
pub unsafe extern "C" fn mwtok_is_special(tok: *const MwTokenizer, id: u32) -> i32 {
    (*tok).inner.get_added_tokens_decoder().get(&id).map_or(0, |t| t.special as i32)
}

/// Encodes one UTF-8 text. `add_special_tokens` applies the file's post-processor (Llama 3's
/// `<|begin_of_text|>`); meshwork's documents add BOS and EOS themselves and pass 0.
#[no_mangle]
pub unsafe extern "C" fn mwtok_encode(
    tok: *const MwTokenizer,
    text: *const u8,
    len: usize,
    add_special_tokens: i32,
    out: *mut MwIds,
    err: *mut *mut c_char,
) -> i32 {
    guarded(err, || {
        let text = utf8(text, len)?;
        let enc = (*tok)
            .inner
            .encode_fast(text, add_special_tokens != 0)
            .map_err(|e| (ERR_INTERNAL, e.to_string()))?;
        *out = into_ids(enc.get_ids());
        Ok(())
    })
}

/// Encodes `n` texts on the crate's thread pool (RAYON_NUM_THREADS threads, else one per core).
/// On error nothing is written to `out`; *bad_index names the text that is not UTF-8, or is
/// usize::MAX when the library failed on the batch as a whole.
#[no_mangle]
pub unsafe extern "C" fn mwtok_encode_batch(
    tok: *const MwTokenizer,
    texts: *const *const u8,
    lens: *const usize,
    n: usize,
    add_special_tokens: i32,
    out: *mut MwIds,
    bad_index: *mut usize,
    err: *mut *mut c_char,
) -> i32 {
    guarded(err, || {
        *bad_index = usize::MAX;
        let mut inputs: Vec<&str> = Vec::with_capacity(n);
        for i in 0..n {
            let text = utf8(*texts.add(i), *lens.add(i)).map_err(|e| {
                *bad_index = i;
                e
            })?;
            inputs.push(text);
        }
        let encodings = (*tok)
            .inner
            .encode_batch_fast(inputs, add_special_tokens != 0)
            .map_err(|e| (ERR_INTERNAL, e.to_string()))?;
        for (i, enc) in encodings.iter().enumerate() {
            *out.add(i) = into_ids(enc.get_ids());
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn mwtok_decode(
    tok: *const MwTokenizer,
    ids: *const u32,
    n: usize,
    skip_special_tokens: i32,
    out: *mut *mut c_char,
    err: *mut *mut c_char,
) -> i32 {
    guarded(err, || {
        let ids: &[u32] = if n == 0 { &[] } else { std::slice::from_raw_parts(ids, n) };
        let text = (*tok)
            .inner
            .decode(ids, skip_special_tokens != 0)
            .map_err(|e| (ERR_INPUT, e.to_string()))?;
        *out = CString::new(text.replace('\0', "\\0"))
            .map(CString::into_raw)
            .map_err(|e| (ERR_INTERNAL, e.to_string()))?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn mwtok_free_ids(ids: MwIds) {
    if !ids.data.is_null() {
        drop(Box::from_raw(ptr::slice_from_raw_parts_mut(ids.data, ids.len)));
    }
}

#[no_mangle]
pub unsafe extern "C" fn mwtok_free_string(s: *mut c_char) {
    if !s.is_null() {
        drop(CString::from_raw(s));
    }
}

/// Llama 3's pre-tokenizer split (the regular expression its tokenizer.json carries).
const LLAMA3_PATTERN: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// Trains a byte-level BPE the way Llama 3's tokenizer is built (its regex split, then the byte
/// mapping; every byte in the initial alphabet, so no text is unknown) on `n` UTF-8 documents, with
/// `vocab_size` ids including the `n_specials` special tokens (ids 0, 1, ... in order), and
/// writes it as `out_path` (a tokenizer.json). The crate's own BpeTrainer, as PyPI's
/// `tokenizers.trainers.BpeTrainer` runs it.
#[no_mangle]
pub unsafe extern "C" fn mwtok_train_bpe(
    texts: *const *const u8,
    lens: *const usize,
    n: usize,
    vocab_size: usize,
    specials: *const *const c_char,
    n_specials: usize,
    out_path: *const c_char,
    err: *mut *mut c_char,
) -> i32 {
    use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
    use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
    use tokenizers::models::TrainerWrapper;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::sequence::Sequence;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::{AddedToken, SplitDelimiterBehavior};

    guarded(err, || {
        let mut docs: Vec<&str> = Vec::with_capacity(n);
        for i in 0..n {
            let text = utf8(*texts.add(i), *lens.add(i)).map_err(|(c, m)| (c, format!("document {i}: {m}")))?;
            docs.push(text);
        }
        let mut special_tokens = Vec::with_capacity(n_specials);
        for i in 0..n_specials {
            let s = CStr::from_ptr(*specials.add(i)).to_string_lossy().into_owned();
            special_tokens.push(AddedToken::from(s, true));
        }
        let split = Split::new(SplitPattern::Regex(LLAMA3_PATTERN.to_string()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| (ERR_INTERNAL, e.to_string()))?;
        let pre = Sequence::new(vec![split.into(), ByteLevel::new(false, true, false).into()]);
        let mut tok = Tokenizer::new(BPE::default());
        tok.with_pre_tokenizer(Some(pre));
        tok.with_decoder(Some(ByteLevelDecoder::default()));
        let alphabet = ByteLevel::alphabet().into_iter().collect();
        let trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .show_progress(false)
            .special_tokens(special_tokens)
            .initial_alphabet(alphabet)
            .build();
        let mut trainer: TrainerWrapper = trainer.into();
        tok.train(&mut trainer, docs.into_iter()).map_err(|e| (ERR_INTERNAL, e.to_string()))?;
        let path = CStr::from_ptr(out_path).to_string_lossy().into_owned();
        tok.save(&path, true).map_err(|e| (ERR_INPUT, format!("cannot write '{path}': {e}")))?;
        Ok(())
    })
}
