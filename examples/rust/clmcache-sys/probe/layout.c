/* Compiled and run by build.rs against the installed clm.h: prints, as Rust
 * source, the size and alignment of each struct, the offset and size of each
 * field, and the value of each macro, so tests/layout.rs can compare them
 * with the #[repr(C)] declarations of src/lib.rs. */
#include <stddef.h>
#include <stdio.h>

#include "clm.h"

#define TYPE(T) printf("    (\"%s\", %zu, %zu),\n", #T, sizeof(T), (size_t)_Alignof(T))
#define FIELD(T, f) printf("    (\"%s.%s\", %zu, %zu),\n", #T, #f, offsetof(T, f), sizeof(((T *)0)->f))
#define CONST(c) printf("    (\"%s\", %lld),\n", #c, (long long)(c))

int main(void) {
  printf("pub const C_TYPES: &[(&str, usize, usize)] = &[\n");
  TYPE(clm_status);
  TYPE(clm_engine_options);
  TYPE(clm_kv_layout);
  TYPE(clm_admit_options);
  TYPE(clm_metrics);
  TYPE(clm_src_decision);
  TYPE(clm_adapter_options);
  TYPE(clm_attention_params);
  printf("];\n");

  printf("pub const C_FIELDS: &[(&str, usize, usize)] = &[\n");
  FIELD(clm_engine_options, struct_size);
  FIELD(clm_engine_options, num_pages);
  FIELD(clm_engine_options, page_size);
  FIELD(clm_engine_options, num_layers);
  FIELD(clm_engine_options, kv_heads);
  FIELD(clm_engine_options, head_dim);
  FIELD(clm_engine_options, kv_dtype);
  FIELD(clm_engine_options, memory);
  FIELD(clm_engine_options, device);
  FIELD(clm_engine_options, eviction_policy);
  FIELD(clm_engine_options, slru_protected_fraction);
  FIELD(clm_engine_options, src_daily_requests);
  FIELD(clm_engine_options, src_threshold);
  FIELD(clm_engine_options, src_breaker_score);
  FIELD(clm_engine_options, src_breaker_steps);
  FIELD(clm_engine_options, special_token_ids);
  FIELD(clm_engine_options, n_special_token_ids);

  FIELD(clm_kv_layout, struct_size);
  FIELD(clm_kv_layout, base);
  FIELD(clm_kv_layout, page_bytes);
  FIELD(clm_kv_layout, layer_bytes);
  FIELD(clm_kv_layout, num_pages);
  FIELD(clm_kv_layout, page_size);
  FIELD(clm_kv_layout, num_layers);
  FIELD(clm_kv_layout, kv_heads);
  FIELD(clm_kv_layout, head_dim);
  FIELD(clm_kv_layout, kv_dtype);
  FIELD(clm_kv_layout, memory);

  FIELD(clm_admit_options, struct_size);
  FIELD(clm_admit_options, cache_salt);
  FIELD(clm_admit_options, cache_salt_len);
  FIELD(clm_admit_options, adapter_id);
  FIELD(clm_admit_options, priority);

  FIELD(clm_metrics, struct_size);
  FIELD(clm_metrics, tokens_queried);
  FIELD(clm_metrics, tokens_hit);
  FIELD(clm_metrics, hit_rate);
  FIELD(clm_metrics, cached_tokens);
  FIELD(clm_metrics, evictable_tokens);
  FIELD(clm_metrics, protected_tokens);
  FIELD(clm_metrics, pages_used);
  FIELD(clm_metrics, pages_free);
  FIELD(clm_metrics, evicted_tokens);
  FIELD(clm_metrics, evictions);
  FIELD(clm_metrics, inserted_tokens);
  FIELD(clm_metrics, admitted);
  FIELD(clm_metrics, finished);
  FIELD(clm_metrics, aborted);
  FIELD(clm_metrics, rejected);
  FIELD(clm_metrics, active_sequences);
  FIELD(clm_metrics, metadata_bytes);
  FIELD(clm_metrics, src_threshold);
  FIELD(clm_metrics, src_steps);
  FIELD(clm_metrics, src_unscored_steps);
  FIELD(clm_metrics, src_reuse_decisions);
  FIELD(clm_metrics, src_retrievals_found);
  FIELD(clm_metrics, src_retrievals_failed);
  FIELD(clm_metrics, src_breaker_trips);
  FIELD(clm_metrics, src_baseline_sequences);
  FIELD(clm_metrics, src_injections);

  FIELD(clm_src_decision, score);
  FIELD(clm_src_decision, threshold);
  FIELD(clm_src_decision, scored);
  FIELD(clm_src_decision, reuse);
  FIELD(clm_src_decision, baseline);
  FIELD(clm_src_decision, reserved);

  FIELD(clm_adapter_options, struct_size);
  FIELD(clm_adapter_options, num_layers);
  FIELD(clm_adapter_options, layers);
  FIELD(clm_adapter_options, n_layers);
  FIELD(clm_adapter_options, residual_scale);

  FIELD(clm_attention_params, struct_size);
  FIELD(clm_attention_params, layer);
  FIELD(clm_attention_params, num_q_heads);
  FIELD(clm_attention_params, softmax_scale);
  FIELD(clm_attention_params, sliding_window);
  FIELD(clm_attention_params, num_threads);
  FIELD(clm_attention_params, stream);
  printf("];\n");

  printf("pub const C_CONSTANTS: &[(&str, i64)] = &[\n");
  CONST(CLM_VERSION_MAJOR);
  CONST(CLM_VERSION_MINOR);
  CONST(CLM_VERSION_PATCH);
  CONST(CLM_VERSION_NUMBER);
  CONST(CLM_OK);
  CONST(CLM_ERR_INVALID_ARGUMENT);
  CONST(CLM_ERR_OUT_OF_MEMORY);
  CONST(CLM_ERR_NOT_FOUND);
  CONST(CLM_ERR_FAILED_PRECONDITION);
  CONST(CLM_ERR_UNSUPPORTED);
  CONST(CLM_ERR_INTERNAL);
  CONST(CLM_ERR_IO);
  CONST(CLM_KV_F32);
  CONST(CLM_KV_F16);
  CONST(CLM_KV_BF16);
  CONST(CLM_MEMORY_NONE);
  CONST(CLM_MEMORY_HOST);
  CONST(CLM_MEMORY_DEVICE);
  CONST(CLM_EVICT_LRU);
  CONST(CLM_EVICT_LFU);
  CONST(CLM_EVICT_SLRU);
  CONST(CLM_EVICT_PRIORITY);
  CONST(CLM_GELU_TANH);
  CONST(CLM_GELU_ERF);
  CONST(CLM_DTYPE_F32);
  CONST(CLM_DTYPE_F16);
  CONST(CLM_DTYPE_BF16);
  printf("];\n");
  return 0;
}
