// Shared by the CPU and GPU attention suites: the strided [tokens, batch, heads, dim] views the kernels
// must honour, and the shape of one test case.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ostream>

namespace laga::test {

// dense: plain [tokens, batch, heads, dim]; wide: each head row padded and offset inside a wider row (the
// interleaved q/kv projections); batch_major: [batch, tokens, heads, dim + pad], token stride < batch stride.
enum class ViewLayout { dense, wide, batch_major };

struct AttentionCase {
  const char* name;
  std::int64_t batch, q_len, kv_len, q_heads, kv_heads, d_qk, d_v, q_offset;
  ViewLayout layout;
  bool v_aliases_k;  // absorbed MLA: v is the first d_v columns of k, same pointer and strides
};
// Readable failure messages instead of gtest's byte dump of the struct.
inline void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }

// Element strides of a view and the buffer it needs (elements from the buffer's start; the view's first
// element is at col0).
struct ViewStrides {
  std::int64_t token = 0, batch = 0, head = 0, col0 = 0, size = 0;
};

inline ViewStrides view_strides(ViewLayout layout, std::int64_t tokens, std::int64_t batch, std::int64_t heads,
                                std::int64_t dim) {
  ViewStrides v;
  std::int64_t width = dim;
  switch (layout) {
    case ViewLayout::dense:
      v.token = batch * heads * width;
      v.batch = heads * width;
      break;
    case ViewLayout::wide:
      width = dim + 7;
      v.col0 = 3;
      v.token = batch * heads * width;
      v.batch = heads * width;
      break;
    case ViewLayout::batch_major:
      width = dim + 5;
      v.col0 = 2;
      v.token = heads * width;
      v.batch = tokens * heads * width;
      break;
  }
  v.head = width;
  v.size = std::max<std::int64_t>(tokens * batch * heads * width, 1);
  return v;
}

}  // namespace laga::test
