// The C ABI between the benchworker and FBGEMM's table-batched embedding
// (TBE) op, which FBGEMM registers with libtorch's dispatcher and which no
// libtorch C API reaches. Tensors cross as `at::Tensor*`, the pointers tch
// holds. Every function catches what libtorch throws and returns its
// message: nothing unwinds into Rust.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/autograd/autograd.h>
#include <c10/core/GradMode.h>

#include <dlfcn.h>

#include <cstring>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// The ops, one per optimizer fused into the backward, in the order of
// `EmbshardTbeArgs::optimizer`.
const char* const kOps[] = {
    "fbgemm::split_embedding_codegen_lookup_sgd_function_pt2",
    "fbgemm::split_embedding_codegen_lookup_adagrad_function_pt2",
    "fbgemm::split_embedding_codegen_lookup_rowwise_adagrad_function_pt2",
};
const int kSgd = 0;
const int kAdagrad = 1;
const int kRowwiseAdagrad = 2;

const char* op_name(int optimizer) {
  if (optimizer < 0 || optimizer > kRowwiseAdagrad) {
    throw std::invalid_argument("no FBGEMM op for optimizer " + std::to_string(optimizer));
  }
  return kOps[optimizer];
}

void put(char* buf, size_t len, const std::string& text) {
  if (buf == nullptr || len == 0) return;
  std::strncpy(buf, text.c_str(), len - 1);
  buf[len - 1] = '\0';
}

template <typename F>
int guarded(char* err, size_t errlen, F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    put(err, errlen, e.what());
  } catch (...) {
    put(err, errlen, "an unknown C++ exception");
  }
  return 1;
}

c10::List<at::Tensor> tensor_list(at::Tensor* const* ts, size_t n) {
  c10::List<at::Tensor> list;
  for (size_t i = 0; i < n; ++i) list.push_back(*ts[i]);
  return list;
}

}  // namespace

extern "C" {

// Everything the op takes that the benchworker chooses; the rest is fixed
// below (no cache, no variable batch, no weight decay, no clipping).
struct EmbshardTbeArgs {
  at::Tensor* placeholder;  // 0 elements, requires grad: the autograd hook
  at::Tensor* const* weights;
  size_t n_weights;
  at::Tensor* d_offsets;
  int64_t total_d;
  int64_t max_d;
  at::Tensor* hash_size_cumsum;
  int64_t total_hash_size_bits;
  at::Tensor* indices;
  at::Tensor* offsets;
  int64_t pooling_mode;
  int64_t output_dtype;
  at::Tensor* lxu_cache_locations;
  int64_t iter;
  int64_t info_b_num_bits;
  int64_t info_b_mask;
  int64_t use_homogeneous_placements;
  int64_t stochastic_rounding;
  at::Tensor* const* momentum;
  size_t n_momentum;
  at::Tensor* learning_rate;
  double eps;
  // 0: SGD (no state), 1: AdaGrad, 2: row-wise AdaGrad.
  int32_t optimizer;
};

// Loads a shared library with its symbols visible to those loaded later.
int embshard_dlopen(const char* path, char* err, size_t errlen) {
  if (dlopen(path, RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* why = dlerror();
    put(err, errlen, why != nullptr ? why : "dlopen failed");
    return 1;
  }
  return 0;
}

// The schema of the op for `optimizer` as FBGEMM registered it.
int embshard_tbe_schema(int32_t optimizer, char* out, size_t outlen, char* err,
                        size_t errlen) {
  return guarded(err, errlen, [&] {
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow(op_name(optimizer), "");
    std::ostringstream s;
    s << op.schema();
    put(out, outlen, s.str());
  });
}

// The forward: `*out` becomes a new `[B, total_D]` tensor whose backward
// applies the update.
int embshard_tbe_forward(const EmbshardTbeArgs* a, at::Tensor** out, char* err,
                         size_t errlen) {
  return guarded(err, errlen, [&] {
    c10::AutoGradMode grad(true);
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow(op_name(a->optimizer), "");
    torch::jit::Stack stack;
    stack.emplace_back(*a->placeholder);
    stack.emplace_back(tensor_list(a->weights, a->n_weights));
    stack.emplace_back(*a->d_offsets);
    stack.emplace_back(a->total_d);
    stack.emplace_back(a->max_d);
    stack.emplace_back(*a->hash_size_cumsum);
    stack.emplace_back(a->total_hash_size_bits);
    stack.emplace_back(*a->indices);
    stack.emplace_back(*a->offsets);
    stack.emplace_back(a->pooling_mode);
    stack.emplace_back(c10::IValue());  // indice_weights
    stack.emplace_back(c10::IValue());  // feature_requires_grad
    stack.emplace_back(a->output_dtype);
    // B_offsets, vbe_output_offsets_feature_rank,
    // vbe_B_offsets_rank_per_feature, lxu_cache_locations, uvm_cache_stats,
    // prev_iter_dev, vbe_output_offsets.
    c10::List<std::optional<at::Tensor>> aux;
    for (int i = 0; i < 3; ++i) aux.push_back(std::nullopt);
    aux.push_back(*a->lxu_cache_locations);
    for (int i = 0; i < 3; ++i) aux.push_back(std::nullopt);
    stack.emplace_back(aux);
    stack.emplace_back(std::vector<int64_t>{a->iter, a->info_b_num_bits, a->info_b_mask});
    // gwd_lower_bound, max_gradient (unused without clipping).
    stack.emplace_back(std::vector<double>{0.0, 1.0});
    // is_experimental_tbe, use_uniq_cache_locations_bwd,
    // use_homogeneous_placements, apply_global_weight_decay,
    // gradient_clipping, stochastic_rounding, mixed_D.
    c10::List<bool> flags({false, false, a->use_homogeneous_placements != 0, false, false,
                           a->stochastic_rounding != 0, true});
    stack.emplace_back(flags);
    // The optimizer's arguments, as each op's schema lists them.
    if (a->optimizer != kSgd) stack.emplace_back(tensor_list(a->momentum, a->n_momentum));
    stack.emplace_back(*a->learning_rate);
    if (a->optimizer == kAdagrad) {
      stack.emplace_back(std::vector<double>{a->eps});
    } else if (a->optimizer == kRowwiseAdagrad) {
      stack.emplace_back(std::vector<int64_t>{0});  // weight_decay_mode: none
      stack.emplace_back(std::vector<double>{a->eps, 0.0, 0.0});  // eps, weight_decay, max_norm
    }
    stack.emplace_back(int64_t{-1});  // max_B
    stack.emplace_back(int64_t{-1});  // max_B_feature_rank
    stack.emplace_back(int64_t{-1});  // vbe_output_size
    stack.emplace_back(c10::IValue());  // vbe_output
    op.callBoxed(&stack);
    *out = new at::Tensor(stack.at(0).toTensor());
  });
}

// The backward of a forward's output: updates the weights and the
// optimizer state in place.
int embshard_tbe_backward(at::Tensor* out, at::Tensor* grad, char* err, size_t errlen) {
  return guarded(err, errlen, [&] { torch::autograd::backward({*out}, {*grad}); });
}

}  // extern "C"
