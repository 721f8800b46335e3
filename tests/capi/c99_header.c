/*
 * tests/capi/c99_header.c: clm.h is a C99 header. Compiled with -std=c99
 * -pedantic -Wall -Wextra -Werror (and clmcache's own warnings); it names every
 * type, macro and function of clm.h, checks each function's prototype by
 * assigning it to a pointer of the exact documented type, and its main()
 * creates and frees an engine against the shared library.
 */
#include "clm.h"
#include "clm.h" /* the include guard works */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef CLM_H
#error "clm.h defines no include guard CLM_H"
#endif
#ifndef CLM_API
#error "clm.h defines no CLM_API"
#endif

/* ---- macros: integer constants usable by the preprocessor ---------------- */
#if CLM_VERSION_NUMBER != CLM_VERSION_MAJOR * 10000 + CLM_VERSION_MINOR * 100 + CLM_VERSION_PATCH
#error "CLM_VERSION_NUMBER disagrees with its parts"
#endif
#if CLM_OK != 0 || CLM_ERR_INVALID_ARGUMENT != -1 || CLM_ERR_OUT_OF_MEMORY != -2 || CLM_ERR_NOT_FOUND != -3 || \
    CLM_ERR_FAILED_PRECONDITION != -4 || CLM_ERR_UNSUPPORTED != -5 || CLM_ERR_INTERNAL != -6 || CLM_ERR_IO != -7
#error "status codes changed: they are ABI"
#endif
#if CLM_KV_F32 != 0 || CLM_KV_F16 != 1 || CLM_KV_BF16 != 2
#error "kv dtypes changed: they are ABI"
#endif
#if CLM_MEMORY_NONE != 0 || CLM_MEMORY_HOST != 1 || CLM_MEMORY_DEVICE != 2
#error "memory kinds changed: they are ABI"
#endif
#if CLM_EVICT_LRU != 0 || CLM_EVICT_LFU != 1 || CLM_EVICT_SLRU != 2 || CLM_EVICT_PRIORITY != 3
#error "eviction policies changed: they are ABI"
#endif

/* C99 has no _Static_assert: a negative array size fails the build. */
#define C99_STATIC_ASSERT(cond, name) typedef char c99_static_assert_##name[(cond) ? 1 : -1]

/* ---- types ---------------------------------------------------------------- */
C99_STATIC_ASSERT(sizeof(clm_status) == 4, clm_status_is_int32);
C99_STATIC_ASSERT((clm_status)-1 < 0, clm_status_is_signed);
C99_STATIC_ASSERT(offsetof(clm_engine_options, struct_size) == 0, engine_options_size_first);
C99_STATIC_ASSERT(offsetof(clm_admit_options, struct_size) == 0, admit_options_size_first);
C99_STATIC_ASSERT(offsetof(clm_metrics, struct_size) == 0, metrics_size_first);
C99_STATIC_ASSERT(offsetof(clm_kv_layout, struct_size) == 0, kv_layout_size_first);

/* Every field, with its type (a wrong type warns, and warnings are errors). */
static void use_types(clm_engine_options *eo, clm_admit_options *ao, clm_kv_layout *kl, clm_metrics *m) {
  uint32_t *u32;
  int32_t *i32;
  int64_t *i64;
  uint64_t *u64;
  double *f64;
  size_t *sz;
  const char **str;
  void **ptr;
  clm_engine *engine = NULL; /* opaque: only pointers to them exist */
  clm_seq *seq = NULL;

  u32 = &eo->struct_size;
  i32 = &eo->num_pages;
  i32 = &eo->page_size;
  i32 = &eo->num_layers;
  i32 = &eo->kv_heads;
  i32 = &eo->head_dim;
  i32 = &eo->kv_dtype;
  i32 = &eo->memory;
  i32 = &eo->device;
  i32 = &eo->eviction_policy;
  f64 = &eo->slru_protected_fraction;

  u32 = &ao->struct_size;
  str = &ao->cache_salt;
  sz = &ao->cache_salt_len;
  i32 = &ao->adapter_id;
  i32 = &ao->priority;

  u32 = &kl->struct_size;
  ptr = &kl->base;
  sz = &kl->page_bytes;
  sz = &kl->layer_bytes;
  i32 = &kl->num_pages;
  i32 = &kl->page_size;
  i32 = &kl->num_layers;
  i32 = &kl->kv_heads;
  i32 = &kl->head_dim;
  i32 = &kl->kv_dtype;
  i32 = &kl->memory;

  u32 = &m->struct_size;
  u64 = &m->tokens_queried;
  u64 = &m->tokens_hit;
  f64 = &m->hit_rate;
  i64 = &m->cached_tokens;
  i64 = &m->evictable_tokens;
  i64 = &m->protected_tokens;
  i32 = &m->pages_used;
  i32 = &m->pages_free;
  u64 = &m->evicted_tokens;
  u64 = &m->evictions;
  u64 = &m->inserted_tokens;
  u64 = &m->admitted;
  u64 = &m->finished;
  u64 = &m->aborted;
  u64 = &m->rejected;
  i64 = &m->active_sequences;
  u64 = &m->metadata_bytes;

  (void)u32, (void)i32, (void)i64, (void)u64, (void)f64, (void)sz, (void)str, (void)ptr;
  (void)engine, (void)seq;
}

/* ---- functions: each prototype, exactly as documented --------------------- */
static int (*const p_version)(void) = clm_version;
static const char *(*const p_version_string)(void) = clm_version_string;
static const char *(*const p_status_name)(clm_status) = clm_status_name;
static const char *(*const p_last_error)(void) = clm_last_error;
static clm_status (*const p_engine_options_init)(clm_engine_options *, size_t) = clm_engine_options_init;
static clm_status (*const p_engine_create)(clm_engine **, const clm_engine_options *) = clm_engine_create;
static void (*const p_engine_free)(clm_engine *) = clm_engine_free;
static clm_status (*const p_engine_kv_layout)(clm_kv_layout *, const clm_engine *) = clm_engine_kv_layout;
static clm_status (*const p_admit_options_init)(clm_admit_options *, size_t) = clm_admit_options_init;
static clm_status (*const p_engine_admit)(clm_seq **, clm_engine *, const int32_t *, size_t,
                                          const clm_admit_options *) = clm_engine_admit;
static clm_status (*const p_seq_extend)(clm_seq *, const int32_t *, size_t) = clm_seq_extend;
static clm_status (*const p_seq_finish)(clm_seq *) = clm_seq_finish;
static clm_status (*const p_seq_abort)(clm_seq *) = clm_seq_abort;
static void (*const p_seq_free)(clm_seq *) = clm_seq_free;
static int32_t (*const p_seq_cached_tokens)(const clm_seq *) = clm_seq_cached_tokens;
static const int32_t *(*const p_seq_page_table)(const clm_seq *, size_t *) = clm_seq_page_table;
static const int64_t *(*const p_seq_slots)(const clm_seq *, size_t *) = clm_seq_slots;
static clm_status (*const p_engine_batch_page_table)(int32_t *, int32_t *, size_t, size_t *, int32_t *, clm_engine *,
                                                     clm_seq *const *, size_t) = clm_engine_batch_page_table;
static clm_status (*const p_engine_metrics)(clm_metrics *, const clm_engine *) = clm_engine_metrics;

static int fail(const char *what, clm_status status) {
  fprintf(stderr, "c99_header: %s: %s (%d): %s\n", what, p_status_name(status), (int)status, p_last_error());
  return 1;
}

/* Creates an engine, runs one request through every call, frees it. */
int main(void) {
  clm_engine_options options;
  clm_admit_options admit;
  clm_kv_layout layout;
  clm_metrics metrics;
  clm_engine *engine = NULL;
  clm_seq *seq = NULL;
  clm_seq *batch[1];
  const int32_t prompt[5] = {1, 2, 3, 4, 5};
  const int32_t decoded[1] = {6};
  int32_t indptr[2], indices[4], last_page_len[1];
  size_t n_indices = 0, n_pages = 0, n_slots = 0;
  const int32_t *pages;
  const int64_t *slots;
  clm_status s;
  const int kinds[] = {CLM_KV_F32, CLM_KV_F16, CLM_KV_BF16, CLM_MEMORY_NONE, CLM_MEMORY_HOST, CLM_MEMORY_DEVICE,
                       CLM_EVICT_LRU, CLM_EVICT_LFU, CLM_EVICT_SLRU, CLM_EVICT_PRIORITY};
  const clm_status codes[] = {CLM_OK, CLM_ERR_INVALID_ARGUMENT, CLM_ERR_OUT_OF_MEMORY, CLM_ERR_NOT_FOUND,
                              CLM_ERR_FAILED_PRECONDITION, CLM_ERR_UNSUPPORTED, CLM_ERR_INTERNAL, CLM_ERR_IO};
  size_t i;

  use_types(&options, &admit, &layout, &metrics);
  (void)kinds;
  for (i = 0; i < sizeof codes / sizeof codes[0]; ++i) {
    if (strcmp(p_status_name(codes[i]), "unknown") == 0) return fail("status name", codes[i]);
  }
  if (p_version() != CLM_VERSION_NUMBER) {
    fprintf(stderr, "c99_header: library %d (%s), header %d\n", p_version(), p_version_string(), CLM_VERSION_NUMBER);
    return 1;
  }

  if ((s = p_engine_options_init(&options, sizeof options)) != CLM_OK) return fail("engine_options_init", s);
  options.num_pages = 8;
  options.page_size = 4;
  options.memory = CLM_MEMORY_NONE;
  options.eviction_policy = CLM_EVICT_LRU;
  if ((s = p_engine_create(&engine, &options)) != CLM_OK) return fail("engine_create", s);
  memset(&layout, 0, sizeof layout);
  layout.struct_size = sizeof layout;
  if ((s = p_engine_kv_layout(&layout, engine)) != CLM_OK) return fail("engine_kv_layout", s);
  if (layout.base != NULL || layout.num_pages != 8 || layout.memory != CLM_MEMORY_NONE) {
    return fail("kv_layout contents", CLM_ERR_INTERNAL);
  }

  if ((s = p_admit_options_init(&admit, sizeof admit)) != CLM_OK) return fail("admit_options_init", s);
  admit.cache_salt = "c99";
  admit.cache_salt_len = 3;
  if ((s = p_engine_admit(&seq, engine, prompt, 5, &admit)) != CLM_OK) return fail("engine_admit", s);
  if (p_seq_cached_tokens(seq) != 0) return fail("seq_cached_tokens", CLM_ERR_INTERNAL);
  pages = p_seq_page_table(seq, &n_pages);
  slots = p_seq_slots(seq, &n_slots);
  if (!pages || n_pages != 2 || !slots || n_slots != 5) return fail("page table / slots", CLM_ERR_INTERNAL);
  if ((s = p_seq_extend(seq, decoded, 1)) != CLM_OK) return fail("seq_extend", s);
  batch[0] = seq;
  s = p_engine_batch_page_table(indptr, indices, 4, &n_indices, last_page_len, engine, batch, 1);
  if (s != CLM_OK) return fail("engine_batch_page_table", s);
  if (indptr[0] != 0 || indptr[1] != 2 || n_indices != 2 || last_page_len[0] != 2) {
    return fail("batch page table contents", CLM_ERR_INTERNAL);
  }
  if ((s = p_seq_finish(seq)) != CLM_OK) return fail("seq_finish", s);
  if ((s = p_seq_abort(seq)) != CLM_ERR_FAILED_PRECONDITION) return fail("seq_abort after finish", s);
  p_seq_free(seq);

  memset(&metrics, 0, sizeof metrics);
  metrics.struct_size = sizeof metrics;
  if ((s = p_engine_metrics(&metrics, engine)) != CLM_OK) return fail("engine_metrics", s);
  if (metrics.admitted != 1 || metrics.finished != 1 || metrics.cached_tokens != 4) {
    return fail("metrics contents", CLM_ERR_INTERNAL);
  }
  p_engine_free(engine);
  printf("c99_header: clmcache %s, C99 header ok\n", p_version_string());
  return 0;
}
