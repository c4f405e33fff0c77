#include "laga/tensor.hpp"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "laga/backend.hpp"
#include "laga/errors.hpp"

namespace laga {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::BF16: return "bfloat16";
  }
  return "?";
}

const char* device_name(Device d) {
  switch (d) {
    case Device::Cpu: return "cpu";
    case Device::Cuda: return "cuda";
    case Device::Meta: return "meta";
  }
  return "?";
}

DType accum_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

std::uint64_t Allocator::allocate(std::size_t bytes, const std::string& name, MemoryKind kind,
                                  void** ptr) {
  *ptr = bytes ? raw_allocate(bytes) : nullptr;
  LAGA_CHECK(bytes == 0 || *ptr != nullptr || device() == Device::Meta, "out of memory allocating ",
             bytes, " bytes for '", name, "' on ", device_name(device()));
  const std::uint64_t id = next_id_++;
  records_[id] = AllocationRecord{name, bytes, kind, false};
  if (kind == MemoryKind::Activation) {
    live_ += bytes;
    peak_ = std::max(peak_, live_);
  }
  return id;
}

void Allocator::free(std::uint64_t id, void* ptr) {
  auto it = records_.find(id);
  LAGA_CHECK(it != records_.end(), "free of unknown allocation id ", id);
  if (it->second.kind == MemoryKind::Activation) live_ -= it->second.bytes;
  records_.erase(it);
  if (ptr) raw_free(ptr);
}

void Allocator::mark_saved(std::uint64_t id, const std::string& name, const std::vector<std::int64_t>& shape,
                           DType dtype) {
  auto it = records_.find(id);
  LAGA_CHECK(it != records_.end(), "mark_saved of unknown allocation id ", id);
  AllocationRecord& r = it->second;
  r.name = r.saved ? r.name + "/" + name : name;
  r.saved = true;
  r.shape = shape;
  r.dtype = dtype;
}

void Allocator::unmark_saved(std::uint64_t id) {
  auto it = records_.find(id);
  if (it != records_.end()) it->second.saved = false;
}

std::vector<AllocationRecord> Allocator::saved_tensors() const {
  std::vector<AllocationRecord> out;
  for (const auto& [id, r] : records_)
    if (r.saved && r.kind == MemoryKind::Activation) out.push_back(r);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

std::size_t Allocator::saved_bytes() const {
  std::size_t total = 0;
  for (const auto& r : saved_tensors()) total += r.bytes;
  return total;
}

std::vector<AllocationRecord> Allocator::live_activations() const {
  std::vector<AllocationRecord> out;
  for (const auto& [id, r] : records_)
    if (r.kind == MemoryKind::Activation) out.push_back(r);
  return out;
}

void* CpuAllocator::raw_allocate(std::size_t bytes) {
  const std::size_t rounded = (bytes + 63) / 64 * 64;
  return std::aligned_alloc(64, rounded);
}

void CpuAllocator::raw_free(void* ptr) {
  if (poison_freed_) std::memset(ptr, 0xFF, malloc_usable_size(ptr));
  std::free(ptr);
}

std::string shape_string(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) LAGA_CHECK(!__builtin_mul_overflow(n, d, &n), "element count of shape ", shape_string(s), " overflows");
  return n;
}

Tensor::Storage::~Storage() {
  // id 0: the allocation itself failed (ids start at 1), so there is nothing to free. Freeing it would throw
  // from this destructor while the allocation's exception unwinds, and end the process.
  if (alloc && id != 0) alloc->free(id, ptr);
}

Tensor::Tensor(Allocator& alloc, DType dtype, Shape shape, const std::string& name, MemoryKind kind)
    : dtype_(dtype), shape_(std::move(shape)) {
  for (auto d : shape_) LAGA_CHECK(d >= 0, "negative dimension in shape ", shape_string(shape_), " of '", name, "'");
  std::int64_t total = 0;
  LAGA_CHECK(!__builtin_mul_overflow(shape_numel(shape_), std::int64_t(dtype_size(dtype)), &total), "bytes of shape ",
             shape_string(shape_), " of '", name, "' overflow");
  storage_ = std::make_shared<Storage>();
  storage_->alloc = &alloc;
  storage_->name = name;
  storage_->id = alloc.allocate(bytes(), name, kind, &storage_->ptr);
}

Device Tensor::device() const {
  LAGA_CHECK(storage_, "device() of an undefined tensor");
  return storage_->alloc->device();
}

const std::string& Tensor::name() const {
  static const std::string undefined = "<undefined>";
  return storage_ ? storage_->name : undefined;
}

void* Tensor::at(std::int64_t offset) const {
  if (!data()) return nullptr;  // meta tensors: offsets of nothing stay nothing
  return static_cast<char*>(data()) + offset * static_cast<std::int64_t>(dtype_size(dtype_));
}

Tensor Tensor::reshaped(Shape shape) const {
  LAGA_CHECK(shape_numel(shape) == numel(), "reshape of '", name(), "' from ", shape_string(shape_), " to ",
             shape_string(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

void Tensor::mark_saved(const std::string& name) const {
  LAGA_CHECK(storage_, "mark_saved of an undefined tensor");
  storage_->alloc->mark_saved(storage_->id, name, shape_, dtype_);
}

int Backend::mark() {
  host_marks_.push_back(
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
  return int(host_marks_.size()) - 1;
}

double Backend::elapsed(int a, int b) { return host_marks_.at(b) - host_marks_.at(a); }

void Backend::reset_marks() { host_marks_.clear(); }

void Backend::copy_from_host(const Tensor& dst, const void* host) {
  if (dst.data() && dst.bytes()) std::memcpy(dst.data(), host, dst.bytes());
}

void Backend::copy_to_host(void* host, const Tensor& src) {
  if (src.data() && src.bytes()) std::memcpy(host, src.data(), src.bytes());
}

}  // namespace laga
