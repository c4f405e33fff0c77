// The command line's names: devices, the dtype each device runs, variants, layouts and kernels.
#include <algorithm>

#include "laga/cuda.hpp"
#include "laga/errors.hpp"
#include "laga/measure.hpp"

namespace laga {

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::Cpu;
  if (s == "cuda") return Device::Cuda;
  throw InvalidArgument(detail::concat("device = '", s, "': must be one of cpu, cuda"));
}

DType default_dtype(Device d) { return d == Device::Cuda ? DType::BF16 : DType::F32; }

void require_dtype_runs_on(DType dt, Device d) {
  if (d == Device::Cpu)
    LAGA_REQUIRE(dt != DType::BF16, "dtype = bfloat16: the cpu backend runs float32 or float64 "
                                    "(bfloat16 needs --device cuda)");
  else
    LAGA_REQUIRE(dt != DType::F64, "dtype = float64: the cuda backend runs bfloat16 or float32 "
                                   "(float64 needs --device cpu)");
}

void require_cuda_usable() {
#ifdef LAGA_HAVE_CUDA
  LAGA_REQUIRE(cuda_available(), "device = cuda: no usable GPU (no device visible to the CUDA runtime); run "
               "with --device cpu");
#else
  LAGA_REQUIRE(false, "device = cuda: laga was built without CUDA (nvcc was not found at configure time); run "
               "with --device cpu");
#endif
}

namespace {
// kAllVariants' names, in its order.
constexpr std::array<const char*, kAllVariants.size()> kVariantIds = {"explicit", "absorbed", "absorbed-expanded",
                                                                      "laga", "laga-recompute"};
}  // namespace

const char* variant_id(const Variant& v) {
  for (std::size_t i = 0; i < kAllVariants.size(); ++i)
    if (kAllVariants[i].form == v.form && kAllVariants[i].recompute == v.recompute &&
        (v.form != Form::Absorbed || kAllVariants[i].absorbed == v.absorbed))
      return kVariantIds[i];
  return "?";
}

std::vector<std::size_t> parse_variant_ids(const std::vector<std::string>& names) {
  std::vector<std::size_t> out;
  auto add = [&](std::size_t i) {
    if (std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
  };
  std::string known;
  for (const char* id : kVariantIds) known += std::string(known.empty() ? "" : ", ") + id;
  for (const std::string& name : names) {
    if (name == "all") {
      for (std::size_t i = 0; i < kVariantIds.size(); ++i) add(i);
      continue;
    }
    const auto it = std::find(kVariantIds.begin(), kVariantIds.end(), name);
    LAGA_REQUIRE(it != kVariantIds.end(), "form = '", name, "': expected all or a list of ", known);
    add(std::size_t(it - kVariantIds.begin()));
  }
  std::sort(out.begin(), out.end());  // explicit first: the others compare with it
  return out;
}

namespace {
template <typename T, std::size_t N, typename Parse>
std::vector<T> parse_all(const std::vector<std::string>& v, const std::array<T, N>& all, Parse parse) {
  if (v.size() == 1 && v[0] == "all") return {all.begin(), all.end()};
  std::vector<T> out;
  for (const auto& s : v) out.push_back(parse(s));
  return out;
}
}  // namespace

std::vector<Layout> parse_layouts(const std::vector<std::string>& v) { return parse_all(v, kAllLayouts, parse_layout); }
std::vector<AttentionKernel> parse_kernels(const std::vector<std::string>& v) {
  return parse_all(v, kAllKernels, parse_kernel);
}

}  // namespace laga
