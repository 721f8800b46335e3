# The C++ headers that moved into folders by concept (include/clm/<concept>/),
# as pairs: the old path under include/clm/, then the new one. An installed
# package keeps a forwarding header at each old path (cmake/install.cmake): one
# line, marked deprecated, so that a host's `#include "clm/radix_tree.hpp"`
# still builds. The source tree has none, so nothing here uses an old path.
set(clm_moved_headers
  paged_kv_pool.hpp cache/paged_kv_pool.hpp
  radix_tree.hpp cache/radix_tree.hpp
  eviction_policy.hpp cache/eviction_policy.hpp
  kv_dtype.hpp kernels/kv_dtype.hpp
  attention.hpp kernels/attention.hpp
  dense_gemm.hpp kernels/dense_gemm.hpp
  activations.hpp kernels/activations.hpp
  src_head.hpp model/src_head.hpp
  src_gate.hpp model/src_gate.hpp
  src_tracker.hpp model/src_tracker.hpp
  src_labels.hpp model/src_labels.hpp
  snapshot_projection.hpp model/snapshot_projection.hpp
  snapshot_adapter.hpp model/snapshot_adapter.hpp
  src_head_training.hpp model/src_head_training.hpp
  adapter_fit.hpp model/adapter_fit.hpp
  safetensors.hpp io/safetensors.hpp
  metrics_text.hpp metrics/metrics_text.hpp
  device_memory.hpp device/device_memory.hpp
  cuda_kernels.hpp device/cuda_kernels.hpp
  cuda_clm.hpp device/cuda_clm.hpp)

# Writes the forwarding headers into ${dir}/clm/ (only when their text
# changes) and sets ${out_var} to their paths. A pair whose new header is
# missing, or whose old path is back in the source tree, is a configure error:
# the list must stay true.
function(clm_write_forwarding_headers dir out_var)
  set(files)
  set(pairs ${clm_moved_headers})
  list(LENGTH pairs count)
  math(EXPR last "${count} - 1")
  foreach(i RANGE 0 ${last} 2)
    math(EXPR j "${i} + 1")
    list(GET pairs ${i} old)
    list(GET pairs ${j} new)
    if(NOT EXISTS ${PROJECT_SOURCE_DIR}/include/clm/${new})
      message(FATAL_ERROR "cmake/moved_headers.cmake: clm/${old} forwards to clm/${new}, which does not exist")
    endif()
    if(EXISTS ${PROJECT_SOURCE_DIR}/include/clm/${old})
      message(FATAL_ERROR "cmake/moved_headers.cmake: include/clm/${old} is in the source tree again")
    endif()
    file(CONFIGURE OUTPUT ${dir}/clm/${old} CONTENT
      "#include \"clm/${new}\"  // deprecated: clm/${old} moved to clm/${new}; include that (this forwarding header goes away in a later release)\n")
    list(APPEND files ${dir}/clm/${old})
  endforeach()
  set(${out_var} ${files} PARENT_SCOPE)
endfunction()
