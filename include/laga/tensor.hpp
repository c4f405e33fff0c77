// Tensors and the accounting allocator: every activation byte goes through one Allocator, which knows the
// live and peak bytes, and the name and size of every tensor kept from forward to backward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace laga {

enum class DType { F32, F64, BF16 };
// meta: shapes and byte accounting only, no storage (the planner runs the real orchestration on it).
enum class Device { Cpu, Cuda, Meta };

std::size_t dtype_size(DType);
const char* dtype_name(DType);
const char* device_name(Device);
// The dtype softmax statistics and RMSNorm's reciprocal RMS are kept in: f64 for f64, else f32.
DType accum_dtype(DType);

// What an allocation is for. Only activations count toward live/peak bytes; weights, the block's input,
// and the gradients handed back to the caller are the caller's memory (DESIGN.md section 4).
enum class MemoryKind { Activation, External };

struct AllocationRecord {
  std::string name;
  std::size_t bytes = 0;
  MemoryKind kind = MemoryKind::Activation;
  bool saved = false;  // kept from forward to backward
  std::vector<std::int64_t> shape;  // of the tensor saved (set by mark_saved)
  DType dtype = DType::F32;
};

// Accounting allocator. Subclasses provide the raw memory; the base counts every byte.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;

  // Returns an id for free(); `ptr` receives the memory (null on the meta device or for 0 bytes).
  std::uint64_t allocate(std::size_t bytes, const std::string& name, MemoryKind kind, void** ptr);
  void free(std::uint64_t id, void* ptr);

  // Flags an allocation as saved under `name`; saved again under another name (one tensor kept for two
  // consumers, e.g. attention's output that is also W_O's input), the names are joined with '/'.
  void mark_saved(std::uint64_t id, const std::string& name, const std::vector<std::int64_t>& shape, DType dtype);
  void unmark_saved(std::uint64_t id);

  std::size_t live_bytes() const { return live_; }
  std::size_t peak_bytes() const { return peak_; }
  void reset_peak() { peak_ = live_; }
  // Live allocations flagged as saved, by name (sorted), with their bytes.
  std::vector<AllocationRecord> saved_tensors() const;
  std::size_t saved_bytes() const;
  std::vector<AllocationRecord> live_activations() const;

 protected:
  virtual void* raw_allocate(std::size_t bytes) = 0;
  virtual void raw_free(void* ptr) = 0;

 private:
  std::uint64_t next_id_ = 1;
  std::size_t live_ = 0;
  std::size_t peak_ = 0;
  std::map<std::uint64_t, AllocationRecord> records_;
};

// Host memory, 64-byte aligned.
class CpuAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Cpu; }
  // Tests: fill memory with 0xFF bytes (NaN in every float type) as it is freed, so that a read after the free,
  // even from code the sanitizers do not instrument (BLAS), gives NaN or another tensor's values, not the old ones.
  void set_poison_freed(bool on) { poison_freed_ = on; }

 protected:
  void* raw_allocate(std::size_t bytes) override;
  void raw_free(void* ptr) override;

 private:
  bool poison_freed_ = false;
};

// No storage: counts bytes only.
class MetaAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Meta; }

 protected:
  void* raw_allocate(std::size_t) override { return nullptr; }
  void raw_free(void*) override {}
};

using Shape = std::vector<std::int64_t>;
std::string shape_string(const Shape&);
std::int64_t shape_numel(const Shape&);

// A contiguous, row-major tensor owning its storage (shared between copies of the handle).
class Tensor {
 public:
  Tensor() = default;
  Tensor(Allocator& alloc, DType dtype, Shape shape, const std::string& name,
         MemoryKind kind = MemoryKind::Activation);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const;
  const Shape& shape() const { return shape_; }
  std::int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int rank() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const { return shape_numel(shape_); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  const std::string& name() const;

  void* data() const { return storage_ ? storage_->ptr : nullptr; }
  template <typename T>
  T* data_as() const { return static_cast<T*>(data()); }
  // Pointer to element `offset` (in elements) of this tensor.
  void* at(std::int64_t offset) const;

  // Same storage seen with another shape of the same number of elements.
  Tensor reshaped(Shape shape) const;

  // Flag this tensor as kept for backward (the allocator lists it by `name`).
  void mark_saved(const std::string& name) const;

 private:
  struct Storage {
    Allocator* alloc = nullptr;
    std::uint64_t id = 0;
    void* ptr = nullptr;
    std::string name;
    ~Storage();
  };
  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::F32;
  Shape shape_;
};

}  // namespace laga
