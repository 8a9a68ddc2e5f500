// SlotTable<T>: a generation-checked table behind the Agent's handles. Insert returns an
// (index, generation) pair; Find refuses a stale or forged pair. Freed slots are reused with a
// bumped generation. Not thread-safe: the Agent guards each table with its mutex.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "xfer/types.h"

namespace kvpush::xfer {

template <typename T>
class SlotTable {
 public:
  /// Stores `value` and returns its handle bits (generation >= 1).
  HandleBits Insert(T value) {
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    Slot& s = slots_[index];
    s.value.emplace(std::move(value));
    if (++s.generation == 0) s.generation = 1;
    ++size_;
    return {index, s.generation};
  }
  /// The value behind `h`, or nullptr if `h` is not a live handle of this table.
  T* Find(HandleBits h) {
    if (h.index >= slots_.size()) return nullptr;
    Slot& s = slots_[h.index];
    if (!s.value || s.generation != h.generation) return nullptr;
    return &*s.value;
  }
  /// The value at `index` regardless of generation, or nullptr if free.
  T* AtIndex(uint32_t index) {
    if (index >= slots_.size() || !slots_[index].value) return nullptr;
    return &*slots_[index].value;
  }
  /// Generation currently stored at index (valid only if AtIndex(index) != nullptr).
  uint32_t GenerationAt(uint32_t index) const { return slots_[index].generation; }
  /// Removes `h`; false if it was not live.
  bool Erase(HandleBits h) {
    if (Find(h) == nullptr) return false;
    slots_[h.index].value.reset();
    free_.push_back(h.index);
    --size_;
    return true;
  }
  size_t size() const { return size_; }
  /// Calls fn(HandleBits, T&) for every live slot.
  template <typename F>
  void ForEach(F&& fn) {
    for (uint32_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].value) fn(HandleBits{i, slots_[i].generation}, *slots_[i].value);
  }

 private:
  struct Slot {
    uint32_t generation = 0;
    std::optional<T> value;
  };
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  size_t size_ = 0;
};

}  // namespace kvpush::xfer
