// TofuRegionOverlaps: the inner loop of the tofu_tf cost model, as a TensorFlow custom op.
//
// For boxes int64 [M, k, D, 2] (part p's half-open [start, stop) region of entry m, per dim)
// and shapes int64 [M, D], the output int64 [M, D + 1] holds
//   out[m, d] = sum_p |box_p ∩ H_p(Split(d))|   for d < D,
//   out[m, D] = sum_p |box_p|                   (= the overlap with H_p(R), the whole tensor),
// where H_p(Split(d)) is the whole tensor with dim d restricted to the p-th uneven part of
// the k-way split of shapes[m, d] (the first shapes[m, d] % k parts get one more element).
// Negative lengths count as 0. Because H_p(Split(d)) is full in every dim but d,
//   |box_p ∩ H_p(Split(d))| = (prod_{e != d} len_e) * |[start_d, stop_d) ∩ part_p(d)|,
// and the products over all dims but one come from prefix and suffix products: O(k * D)
// per entry, no division. It is the exact port of tofu_tf.search.cost.overlaps_numpy; unlike
// NumPy it reports a volume that does not fit in int64 instead of wrapping around.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tofu {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// Output [M, D + 1] from boxes [M, k, D, 2] and shapes [M, D].
absl::Status OverlapsShape(InferenceContext* c) {
  int k = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("k", &k));
  ShapeHandle boxes, shapes;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 4, &boxes));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &shapes));
  DimensionHandle unused, m, d, columns;
  TF_RETURN_IF_ERROR(c->WithValue(c->Dim(boxes, 3), 2, &unused));
  TF_RETURN_IF_ERROR(c->WithValue(c->Dim(boxes, 1), k, &unused));
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(boxes, 0), c->Dim(shapes, 0), &m));
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(boxes, 2), c->Dim(shapes, 1), &d));
  TF_RETURN_IF_ERROR(c->Add(d, 1, &columns));
  c->set_output(0, c->Matrix(m, columns));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("TofuRegionOverlaps")
    .Input("boxes: int64")
    .Input("shapes: int64")
    .Attr("k: int >= 1")
    .Output("volumes: int64")
    .SetShapeFn(OverlapsShape)
    .Doc(R"doc(
Overlap volumes of per-part boxes with every Split(d) layout of a k-way cut.

boxes: [M, k, D, 2] half-open [start, stop) of part p's region of entry m, per dim.
shapes: [M, D] the tensor shape of entry m (dims past its rank are 1).
volumes: [M, D + 1]; column d < D is sum_p |box_p ∩ H_p(Split(d))|, column D is sum_p |box_p|.
)doc");

namespace {

// Pointers and sizes of one call.
struct Batch {
  const int64_t* boxes;   // [M, k, D, 2]
  const int64_t* shapes;  // [M, D]
  int64_t* out;           // [M, D + 1]
  int64_t k;
  int64_t dims;
};

// The entries [begin, end) of a batch. kDims > 0 fixes D at compile time, so the loops over
// dims unroll and the scratch lives in registers; kDims == 0 reads D from the batch. Scratch
// is per shard, never per entry. Run returns false if a volume overflows int64.
template <int kDims>
class OverlapsRange {
 public:
  explicit OverlapsRange(const Batch& batch) : b_(batch) {}

  bool Run(int64_t begin, int64_t end) const {
    constexpr int kStackDims = kDims > 0 ? kDims : 1;
    std::array<int64_t, 6 * kStackDims + 1> stack;
    std::vector<int64_t> heap(kDims > 0 ? 0 : 6 * b_.dims + 1);
    int64_t* scratch = kDims > 0 ? stack.data() : heap.data();
    for (int64_t m = begin; m < end; ++m) {
      if (!Entry(m, scratch)) return false;
    }
    return true;
  }

 private:
  int64_t dims() const { return kDims > 0 ? kDims : b_.dims; }

  // One entry m: out[m, :] summed over the k parts. scratch holds 6 * D + 1 int64.
  bool Entry(int64_t m, int64_t* scratch) const {
    const int64_t dims = this->dims();
    int64_t* base = scratch;                 // [D] shapes[m, d] / k
    int64_t* extra = base + dims;            // [D] shapes[m, d] % k
    int64_t* lo = extra + dims;              // [D] start of part p of dim d
    int64_t* length = lo + dims;             // [D] max(stop - start, 0) of part p's box
    int64_t* suffix = length + dims;         // [D + 1] prod_{e >= d} length[e]
    int64_t* row = suffix + dims + 1;        // [D] accumulated out[m, d]
    const int64_t* shape = b_.shapes + m * dims;
    for (int64_t d = 0; d < dims; ++d) {
      base[d] = shape[d] / b_.k;
      extra[d] = shape[d] % b_.k;
      lo[d] = 0;
      row[d] = 0;
    }
    int64_t total = 0;
    for (int64_t p = 0; p < b_.k; ++p) {
      const int64_t* box = b_.boxes + (m * b_.k + p) * dims * 2;
      if (!Volume(box, length, suffix)) return false;
      if (__builtin_add_overflow(total, suffix[0], &total)) return false;
      AddSplitOverlaps(p, box, base, extra, length, suffix, lo, row);
    }
    int64_t* out = b_.out + m * (dims + 1);
    std::copy(row, row + dims, out);
    out[dims] = total;
    return true;
  }

  // length[d] and the suffix products of one part's box (suffix[0] is its volume).
  bool Volume(const int64_t* box, int64_t* length, int64_t* suffix) const {
    bool overflow = false;
    bool empty = false;
    suffix[dims()] = 1;
    for (int64_t d = dims() - 1; d >= 0; --d) {
      length[d] = std::max<int64_t>(box[2 * d + 1] - box[2 * d], 0);
      empty |= length[d] == 0;
      // On overflow the builtin stores the wrapped product. A wrapped suffix is harmless
      // when some length is 0: it then only meets an intersection or a length of 0.
      overflow |= __builtin_mul_overflow(suffix[d + 1], length[d], &suffix[d]);
    }
    return empty || !overflow;
  }

  // row[d] += (prod_{e != d} length[e]) * |[start_d, stop_d) ∩ part p of dim d|, and
  // lo[d] moves on to part p + 1. Part p of n is [lo, lo + n / k + (p < n % k)).
  void AddSplitOverlaps(int64_t p, const int64_t* box, const int64_t* base,
                        const int64_t* extra, const int64_t* length, const int64_t* suffix,
                        int64_t* lo, int64_t* row) const {
    uint64_t prefix = 1;                     // prod_{e < d} length[e], wrapping
    for (int64_t d = 0; d < dims(); ++d) {
      const int64_t hi = lo[d] + base[d] + (p < extra[d] ? 1 : 0);
      const int64_t inter =
          std::max<int64_t>(std::min(box[2 * d + 1], hi) - std::max(box[2 * d], lo[d]), 0);
      const uint64_t others = prefix * static_cast<uint64_t>(suffix[d + 1]);
      row[d] += static_cast<int64_t>(others * static_cast<uint64_t>(inter));
      prefix *= static_cast<uint64_t>(length[d]);
      lo[d] = hi;
    }
  }

  const Batch b_;
};

// Splits the entries over the CPU worker threads; false if any shard overflowed.
template <int kDims>
bool RunSharded(OpKernelContext* context, const Batch& batch, int64_t entries) {
  const OverlapsRange<kDims> range(batch);
  std::atomic<bool> ok(true);
  const auto& workers = *context->device()->tensorflow_cpu_worker_threads();
  const int64_t cost_per_entry = 10 * batch.k * (batch.dims + 1);  // ~10 ops per part-dim
  ::tensorflow::Shard(workers.num_threads, workers.workers, entries, cost_per_entry,
                      [&](int64_t begin, int64_t end) {
                        if (!range.Run(begin, end)) ok.store(false);
                      });
  return ok.load();
}

// RunSharded with D fixed at compile time for the ranks the search meets most.
bool RunForDims(OpKernelContext* context, const Batch& batch, int64_t entries) {
  switch (batch.dims) {
    case 1: return RunSharded<1>(context, batch, entries);
    case 2: return RunSharded<2>(context, batch, entries);
    case 3: return RunSharded<3>(context, batch, entries);
    case 4: return RunSharded<4>(context, batch, entries);
    case 5: return RunSharded<5>(context, batch, entries);
    case 6: return RunSharded<6>(context, batch, entries);
    default: return RunSharded<0>(context, batch, entries);
  }
}

class TofuRegionOverlapsOp : public OpKernel {
 public:
  explicit TofuRegionOverlapsOp(OpKernelConstruction* context) : OpKernel(context) {
    int k = 0;
    OP_REQUIRES_OK(context, context->GetAttr("k", &k));
    k_ = k;
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& boxes = context->input(0);
    const Tensor& shapes = context->input(1);
    CheckInputs(context, boxes, shapes);
    if (!context->status().ok()) return;
    const int64_t entries = boxes.dim_size(0);
    const int64_t dims = boxes.dim_size(2);
    Tensor* volumes = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({entries, dims + 1}),
                                                     &volumes));
    const Batch batch{boxes.flat<int64_t>().data(), shapes.flat<int64_t>().data(),
                      volumes->flat<int64_t>().data(), k_, dims};
    OP_REQUIRES(context, RunForDims(context, batch, entries),
                absl::InvalidArgumentError(
                    "TofuRegionOverlaps: a box volume (or its sum over the k parts) does not "
                    "fit in int64; boxes should lie inside their tensor's shape."));
  }

 private:
  void CheckInputs(OpKernelContext* context, const Tensor& boxes, const Tensor& shapes) {
    OP_REQUIRES(context, boxes.dims() == 4 && boxes.dim_size(3) == 2,
                absl::InvalidArgumentError(absl::StrCat(
                    "TofuRegionOverlaps: boxes must be [M, k, D, 2], got shape ",
                    boxes.shape().DebugString(), ".")));
    OP_REQUIRES(context, shapes.dims() == 2,
                absl::InvalidArgumentError(absl::StrCat(
                    "TofuRegionOverlaps: shapes must be [M, D], got shape ",
                    shapes.shape().DebugString(), ".")));
    OP_REQUIRES(context, boxes.dim_size(1) == k_,
                absl::InvalidArgumentError(absl::StrCat(
                    "TofuRegionOverlaps: boxes hold ", boxes.dim_size(1),
                    " parts per entry but the op's attr k is ", k_, ".")));
    OP_REQUIRES(context,
                boxes.dim_size(0) == shapes.dim_size(0) && boxes.dim_size(2) == shapes.dim_size(1),
                absl::InvalidArgumentError(absl::StrCat(
                    "TofuRegionOverlaps: boxes ", boxes.shape().DebugString(),
                    " and shapes ", shapes.shape().DebugString(),
                    " disagree on M (dim 0) or D (boxes dim 2, shapes dim 1).")));
    const auto flat = shapes.flat<int64_t>();
    const int64_t* first_negative =
        std::find_if(flat.data(), flat.data() + flat.size(), [](int64_t n) { return n < 0; });
    OP_REQUIRES(context, first_negative == flat.data() + flat.size(),
                absl::InvalidArgumentError(absl::StrCat(
                    "TofuRegionOverlaps: shapes must be non-negative, got ", *first_negative,
                    " at flat index ", first_negative - flat.data(), ".")));
  }

  int64_t k_ = 1;
};

REGISTER_KERNEL_BUILDER(Name("TofuRegionOverlaps").Device(DEVICE_CPU), TofuRegionOverlapsOp);

}  // namespace
}  // namespace tofu
