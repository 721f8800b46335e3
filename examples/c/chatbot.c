/*
 * chatbot.c: a chatbot backend simulated over clmcache's C ABI (C99).
 *
 * Several tenants (each with its own cache_salt) share one engine. Every
 * tenant serves a few multi-turn conversations that start with the same
 * system prompt. A turn's prompt is the previous turn's prompt + the model's
 * output + the new user message, so the engine should find everything up to
 * the previous turn's last full page in the cache.
 *
 * Each round admits the next turn of every active conversation, writes the
 * K/V of the uncached prompt tokens, then decodes the outputs as a batched
 * decoder would: one token per conversation per step, appended with
 * clm_seq_extend, its K/V written into the slot the engine gives back, and
 * the FlashInfer page table of the batch rebuilt with
 * clm_engine_batch_page_table. Finishing a turn publishes prompt + output.
 *
 * The engine keeps the KV bytes in host memory (CLM_MEMORY_HOST), and the
 * "model" writes a value derived from (tenant, position, token, layer, K|V,
 * head, dim) into every element, so reused pages can be read back and checked
 * through clm_engine_kv_layout: this shows how slots and page tables address
 * the pool.
 *
 * Checked as it runs (any surprise prints clm_last_error() and exits 1):
 *   (a) turn n > 1 of a conversation reuses at least the page-aligned length
 *       of turn n-1's prompt + output;
 *   (b) a tenant's first turn gets 0 cached tokens even though another tenant
 *       already published the same system prompt (cache_salt isolation), while
 *       the same tenant's later conversations do reuse that system prompt;
 *   and the slots, page tables, batch page tables, cached K/V bytes and the
 *   final metrics all agree with what the program did.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clm.h"

/* ---- the simulated deployment --------------------------------------------- */
#define PAGE_SIZE 16
#define NUM_PAGES 4096 /* ample: nothing is evicted, so every expected hit must happen */
#define NUM_LAYERS 2
#define KV_HEADS 2
#define HEAD_DIM 8
#define VOCAB 32000
#define SYSTEM_PROMPT_LEN 203 /* deliberately not a multiple of PAGE_SIZE */
#define MAX_TOKENS 4096

#define NUM_TENANTS 3
#define CONVS_PER_TENANT 2
#define NUM_CONVS (NUM_TENANTS * CONVS_PER_TENANT)
#define TURNS 4

typedef struct tenant {
  const char *salt;
  int first_turn_done; /* has any conversation of this tenant finished a turn? */
} tenant;

typedef struct conversation {
  int tenant;
  int start_round; /* conversations start staggered, as users arrive */
  int turns_done;
  uint32_t rng;
  int32_t tokens[MAX_TOKENS]; /* the whole transcript so far */
  size_t len;                 /* tokens[0, len): prompt + outputs of finished turns */
  size_t prev_total;          /* prompt + output of the last finished turn */
  /* the running turn */
  clm_seq *seq;
  size_t prompt_len;
  size_t output_target;
  size_t output_len;
  int32_t cached;
} conversation;

static tenant tenants[NUM_TENANTS] = {{"tenant-acme", 0}, {"tenant-globex", 0}, {"tenant-initech", 0}};
static conversation convs[NUM_CONVS];
static int32_t system_prompt[SYSTEM_PROMPT_LEN];
static clm_engine *engine = NULL;
static clm_kv_layout layout;

static uint64_t total_turns = 0;
static uint64_t total_prompt_tokens = 0;
static uint64_t total_cached_tokens = 0;

/* ---- failure handling ------------------------------------------------------ */
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("chatbot: FAILED: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

/* Every clm_status goes through here: non-OK is fatal, with the library's message. */
static void check(clm_status s, const char *what) {
  if (s != CLM_OK) die("%s: %s (%d): %s", what, clm_status_name(s), (int)s, clm_last_error());
}

/* ---- a deterministic "model" ----------------------------------------------- */
static uint32_t next_rand(uint32_t *state) { /* xorshift32 */
  uint32_t x = *state;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  *state = x;
  return x;
}
static size_t rand_between(uint32_t *state, size_t lo, size_t hi) {
  return lo + (size_t)(next_rand(state) % (uint32_t)(hi - lo + 1));
}
static int32_t rand_token(uint32_t *state) { return (int32_t)(next_rand(state) % VOCAB); }

static uint32_t hash_str(const char *s) { /* FNV-1a */
  uint32_t h = 2166136261u;
  for (; *s; ++s) h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

/* The value the "model" writes at element (head, dim) of K (kv=0) or V (kv=1)
 * for token `token` at position `pos` of layer `layer`, for tenant `t`. */
static uint16_t kv_value(int t, size_t pos, int32_t token, int layer, int kv, int head, int dim) {
  uint32_t h = hash_str(tenants[t].salt);
  h = (h ^ (uint32_t)pos) * 16777619u;
  h = (h ^ (uint32_t)token) * 16777619u;
  h = (h ^ (uint32_t)(layer * 2 + kv)) * 16777619u;
  h = (h ^ (uint32_t)(head * HEAD_DIM + dim)) * 16777619u;
  return (uint16_t)(h ^ (h >> 16));
}

/* Where K (kv=0) or V (kv=1) of `slot` in `layer` starts: page p = slot /
 * page_size, row r = slot % page_size; K at base + p*page_bytes +
 * l*layer_bytes, V layer_bytes/2 further, rows of [kv_heads][head_dim]. */
static uint16_t *kv_row(int64_t slot, int layer, int kv) {
  const size_t page = (size_t)(slot / layout.page_size);
  const size_t row = (size_t)(slot % layout.page_size);
  const size_t elem = sizeof(uint16_t); /* CLM_KV_F16 */
  unsigned char *p = (unsigned char *)layout.base + page * layout.page_bytes + (size_t)layer * layout.layer_bytes +
                     (size_t)kv * (layout.layer_bytes / 2) + row * (size_t)layout.kv_heads * (size_t)layout.head_dim * elem;
  return (uint16_t *)(void *)p;
}

static void write_kv(int t, int64_t slot, size_t pos, int32_t token) {
  int layer, kv, head, dim;
  for (layer = 0; layer < NUM_LAYERS; ++layer)
    for (kv = 0; kv < 2; ++kv) {
      uint16_t *row = kv_row(slot, layer, kv);
      for (head = 0; head < KV_HEADS; ++head)
        for (dim = 0; dim < HEAD_DIM; ++dim) row[head * HEAD_DIM + dim] = kv_value(t, pos, token, layer, kv, head, dim);
    }
}

static void verify_kv(int t, int64_t slot, size_t pos, int32_t token, const char *what) {
  int layer, kv, head, dim;
  for (layer = 0; layer < NUM_LAYERS; ++layer)
    for (kv = 0; kv < 2; ++kv) {
      const uint16_t *row = kv_row(slot, layer, kv);
      for (head = 0; head < KV_HEADS; ++head)
        for (dim = 0; dim < HEAD_DIM; ++dim)
          if (row[head * HEAD_DIM + dim] != kv_value(t, pos, token, layer, kv, head, dim))
            die("%s: cached K/V of position %zu (slot %" PRId64 ", layer %d, %s) is not what was written", what, pos,
                slot, layer, kv ? "V" : "K");
    }
}

static int64_t slot_of(const int32_t *page_table, size_t n_pages, size_t pos) {
  if (pos / PAGE_SIZE >= n_pages) die("position %zu is past the page table (%zu pages)", pos, n_pages);
  return (int64_t)page_table[pos / PAGE_SIZE] * PAGE_SIZE + (int64_t)(pos % PAGE_SIZE);
}

static size_t pages_for(size_t n) { return (n + PAGE_SIZE - 1) / PAGE_SIZE; }
static size_t page_floor(size_t n) { return n / PAGE_SIZE * PAGE_SIZE; }

/* ---- a turn ----------------------------------------------------------------- */
static void start_turn(conversation *c, int index) {
  const tenant *t = &tenants[c->tenant];
  const size_t user_len = rand_between(&c->rng, 5, 40);
  size_t i, n_slots = 0, n_pages = 0;
  const int64_t *slots;
  const int32_t *table;
  clm_admit_options opts;
  char what[96];

  if (c->len + user_len + 64 > MAX_TOKENS) die("conversation %d: transcript buffer too small", index);
  for (i = 0; i < user_len; ++i) c->tokens[c->len + i] = rand_token(&c->rng);
  c->prompt_len = c->len + user_len;
  c->output_target = rand_between(&c->rng, 8, 60);
  c->output_len = 0;

  check(clm_admit_options_init(&opts, sizeof opts), "clm_admit_options_init");
  opts.cache_salt = t->salt;
  opts.cache_salt_len = strlen(t->salt);
  check(clm_engine_admit(&c->seq, engine, c->tokens, c->prompt_len, &opts), "clm_engine_admit");
  c->cached = clm_seq_cached_tokens(c->seq);
  snprintf(what, sizeof what, "%s conv %d turn %d", t->salt, index, c->turns_done + 1);

  printf("%-32s prompt %5zu tokens, cached %5d (%5.1f%%)\n", what, c->prompt_len, (int)c->cached,
         100.0 * (double)c->cached / (double)c->prompt_len);
  ++total_turns;
  total_prompt_tokens += c->prompt_len;
  total_cached_tokens += (uint64_t)c->cached;

  /* The engine's promises: page-aligned, at most prompt_len - 1. */
  if (c->cached < 0 || (size_t)c->cached >= c->prompt_len || c->cached % PAGE_SIZE != 0)
    die("%s: cached %d is not page-aligned in [0, %zu)", what, (int)c->cached, c->prompt_len);
  if (c->turns_done > 0) {
    /* (a): everything up to the previous turn's last full page is reused. */
    if ((size_t)c->cached < page_floor(c->prev_total))
      die("%s: cached %d < page-aligned previous prompt+output %zu", what, (int)c->cached, page_floor(c->prev_total));
  } else if (!t->first_turn_done) {
    /* (b): the tenant's very first turn shares nothing, whoever published the
     * same system prompt before. */
    if (c->cached != 0) die("%s: a new tenant got %d cached tokens (expected 0)", what, (int)c->cached);
  } else {
    /* ...but its later conversations reuse its own copy of the system prompt. */
    if ((size_t)c->cached < page_floor(SYSTEM_PROMPT_LEN))
      die("%s: cached %d < page-aligned system prompt %zu", what, (int)c->cached, page_floor(SYSTEM_PROMPT_LEN));
  }

  table = clm_seq_page_table(c->seq, &n_pages);
  if (!table || n_pages != pages_for(c->prompt_len))
    die("%s: page table has %zu pages, expected %zu", what, n_pages, pages_for(c->prompt_len));
  /* The reused pages hold the K/V this tenant wrote in earlier turns. */
  for (i = 0; i < (size_t)c->cached; ++i) verify_kv(c->tenant, slot_of(table, n_pages, i), i, c->tokens[i], what);

  /* Prefill: write the K/V of prompt[cached, prompt_len) into the given slots. */
  slots = clm_seq_slots(c->seq, &n_slots);
  if (n_slots != c->prompt_len - (size_t)c->cached)
    die("%s: %zu slots for %zu uncached tokens", what, n_slots, c->prompt_len - (size_t)c->cached);
  for (i = 0; i < n_slots; ++i) {
    const size_t pos = (size_t)c->cached + i;
    if (slots[i] != slot_of(table, n_pages, pos)) die("%s: slot of position %zu disagrees with the page table", what, pos);
    write_kv(c->tenant, slots[i], pos, c->tokens[pos]);
  }
}

/* One decode step: the model emits one token, whose K/V goes where extend says. */
static void decode_step(conversation *c) {
  const size_t pos = c->prompt_len + c->output_len;
  const int32_t token = rand_token(&c->rng);
  size_t n_slots = 0, n_pages = 0;
  const int64_t *slots;
  const int32_t *table;

  c->tokens[pos] = token;
  check(clm_seq_extend(c->seq, &token, 1), "clm_seq_extend");
  slots = clm_seq_slots(c->seq, &n_slots);
  table = clm_seq_page_table(c->seq, &n_pages);
  if (n_slots != 1 || !table || n_pages != pages_for(pos + 1))
    die("extend: %zu slots, %zu pages after %zu tokens", n_slots, n_pages, pos + 1);
  if (slots[0] != slot_of(table, n_pages, pos)) die("extend: slot of position %zu disagrees with the page table", pos);
  write_kv(c->tenant, slots[0], pos, token);
  ++c->output_len;
}

static void finish_turn(conversation *c) {
  check(clm_seq_finish(c->seq), "clm_seq_finish");
  clm_seq_free(c->seq);
  c->seq = NULL;
  c->len = c->prompt_len + c->output_len;
  c->prev_total = c->len;
  ++c->turns_done;
  tenants[c->tenant].first_turn_done = 1;
}

/* The batch's FlashInfer page table must describe exactly these sequences. */
static void check_batch(clm_seq *const *seqs, conversation *const *owners, size_t n) {
  int32_t indptr[NUM_CONVS + 1], last_page_len[NUM_CONVS];
  static int32_t indices[NUM_PAGES];
  size_t i, n_indices = 0, expected = 0;
  for (i = 0; i < n; ++i) expected += pages_for(owners[i]->prompt_len + owners[i]->output_len);
  check(clm_engine_batch_page_table(indptr, indices, NUM_PAGES, &n_indices, last_page_len, engine, seqs, n),
        "clm_engine_batch_page_table");
  if (n_indices != expected || indptr[0] != 0 || (size_t)indptr[n] != expected)
    die("batch page table: %zu indices (indptr[n] %d), expected %zu", n_indices, (int)indptr[n], expected);
  for (i = 0; i < n; ++i) {
    const size_t len = owners[i]->prompt_len + owners[i]->output_len;
    size_t n_pages = 0, p;
    const int32_t *table = clm_seq_page_table(seqs[i], &n_pages);
    if ((size_t)(indptr[i + 1] - indptr[i]) != n_pages || (size_t)last_page_len[i] != len - (n_pages - 1) * PAGE_SIZE)
      die("batch page table: sequence %zu has %d pages (last %d), expected %zu (last %zu)", i,
          (int)(indptr[i + 1] - indptr[i]), (int)last_page_len[i], n_pages, len - (n_pages - 1) * PAGE_SIZE);
    for (p = 0; p < n_pages; ++p)
      if (indices[(size_t)indptr[i] + p] != table[p]) die("batch page table: sequence %zu page %zu differs", i, p);
  }
}

int main(void) {
  clm_engine_options eopts;
  clm_metrics m;
  clm_seq *batch[NUM_CONVS];
  conversation *owners[NUM_CONVS];
  uint32_t rng = 12345u;
  int i, round, max_round = 0;
  size_t n;
  clm_status s;

  printf("clmcache %s (header %d.%d.%d)\n", clm_version_string(), CLM_VERSION_MAJOR, CLM_VERSION_MINOR,
         CLM_VERSION_PATCH);
  if (clm_version() / 10000 != CLM_VERSION_MAJOR || clm_version() < CLM_VERSION_NUMBER)
    die("library version %d is older than or incompatible with header %d", clm_version(), CLM_VERSION_NUMBER);

  check(clm_engine_options_init(&eopts, sizeof eopts), "clm_engine_options_init");
  eopts.num_pages = NUM_PAGES;
  eopts.page_size = PAGE_SIZE;
  eopts.num_layers = NUM_LAYERS;
  eopts.kv_heads = KV_HEADS;
  eopts.head_dim = HEAD_DIM;
  eopts.kv_dtype = CLM_KV_F16;
  eopts.memory = CLM_MEMORY_HOST;
  check(clm_engine_create(&engine, &eopts), "clm_engine_create");
  layout.struct_size = (uint32_t)sizeof layout;
  check(clm_engine_kv_layout(&layout, engine), "clm_engine_kv_layout");
  if (!layout.base || layout.page_size != PAGE_SIZE || layout.kv_heads != KV_HEADS || layout.head_dim != HEAD_DIM ||
      layout.num_layers != NUM_LAYERS || layout.kv_dtype != CLM_KV_F16 || layout.memory != CLM_MEMORY_HOST ||
      layout.layer_bytes != 2u * PAGE_SIZE * KV_HEADS * HEAD_DIM * sizeof(uint16_t) ||
      layout.page_bytes != layout.layer_bytes * NUM_LAYERS)
    die("unexpected KV layout (page_bytes %zu, layer_bytes %zu)", layout.page_bytes, layout.layer_bytes);
  printf("pool: %d pages x %zu bytes in host memory\n\n", (int)layout.num_pages, layout.page_bytes);

  /* Every tenant uses the same system prompt; its conversations and tenants
   * arrive one round apart, so a tenant starts after another one published
   * that prompt, and its second conversation after its first. */
  for (i = 0; i < SYSTEM_PROMPT_LEN; ++i) system_prompt[i] = rand_token(&rng);
  for (i = 0; i < NUM_CONVS; ++i) {
    conversation *c = &convs[i];
    c->tenant = i % NUM_TENANTS;
    c->start_round = i % NUM_TENANTS + 2 * (i / NUM_TENANTS);
    c->rng = 0x9e3779b9u * (uint32_t)(i + 1);
    memcpy(c->tokens, system_prompt, sizeof system_prompt);
    c->len = SYSTEM_PROMPT_LEN;
    if (c->start_round + TURNS > max_round) max_round = c->start_round + TURNS;
  }

  for (round = 0; round < max_round; ++round) {
    size_t active = 0, running;
    printf("-- round %d\n", round + 1);
    for (i = 0; i < NUM_CONVS; ++i) {
      conversation *c = &convs[i];
      if (round < c->start_round || c->turns_done >= TURNS) continue;
      start_turn(c, i);
      batch[active] = c->seq;
      owners[active] = c;
      ++active;
    }
    /* Batched decoding: one token per running sequence per step. */
    for (running = active; running > 0;) {
      running = 0;
      for (n = 0; n < active; ++n) {
        if (owners[n]->output_len >= owners[n]->output_target) continue;
        decode_step(owners[n]);
        ++running;
      }
      check_batch(batch, owners, active);
    }
    for (n = 0; n < active; ++n) finish_turn(owners[n]);
  }

  /* An expected failure, to show the error path: a sequence cannot finish twice. */
  {
    clm_seq *seq = NULL;
    const int32_t prompt[3] = {1, 2, 3};
    check(clm_engine_admit(&seq, engine, prompt, 3, NULL), "clm_engine_admit");
    check(clm_seq_finish(seq), "clm_seq_finish");
    s = clm_seq_finish(seq);
    if (s != CLM_ERR_FAILED_PRECONDITION) die("a second finish returned %d, expected failed_precondition", (int)s);
    printf("\nexpected failure: %s: %s\n", clm_status_name(s), clm_last_error());
    clm_seq_free(seq);
    ++total_turns;
    total_prompt_tokens += 3;
  }

  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  check(clm_engine_metrics(&m, engine), "clm_engine_metrics");
  printf("\nmetrics: admitted %" PRIu64 ", finished %" PRIu64 ", aborted %" PRIu64 ", rejected %" PRIu64
         ", active %" PRId64 "\n",
         m.admitted, m.finished, m.aborted, m.rejected, m.active_sequences);
  printf("         tokens queried %" PRIu64 ", hit %" PRIu64 " (hit rate %.3f)\n", m.tokens_queried, m.tokens_hit,
         m.hit_rate);
  printf("         cached %" PRId64 " tokens (%" PRId64 " evictable), pages used %d, free %d, evictions %" PRIu64
         ", metadata %" PRIu64 " bytes\n",
         m.cached_tokens, m.evictable_tokens, (int)m.pages_used, (int)m.pages_free, m.evictions, m.metadata_bytes);
  if (m.admitted != total_turns || m.finished != total_turns || m.aborted != 0 || m.rejected != 0 ||
      m.active_sequences != 0 || m.evictions != 0 || m.tokens_queried != total_prompt_tokens ||
      m.tokens_hit != total_cached_tokens || m.pages_used + m.pages_free != NUM_PAGES)
    die("metrics disagree with the run (%" PRIu64 " turns, %" PRIu64 " prompt tokens, %" PRIu64 " cached)",
        total_turns, total_prompt_tokens, total_cached_tokens);

  clm_engine_free(engine);
  printf("chatbot: OK (%" PRIu64 " turns, %" PRIu64 " of %" PRIu64 " prompt tokens reused)\n", total_turns,
         total_cached_tokens, total_prompt_tokens);
  return 0;
}
