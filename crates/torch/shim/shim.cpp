// What Tern's pytorch backend needs from LibTorch that tch does not expose:
// the forward method's signature (Triton matches config inputs to its
// argument names), c10::InferenceMode, the JIT executor mode, and with CUDA
// the accelerator allocator's emptyCache. Every entry point catches C++
// exceptions and returns them as a malloc'd message.
#include <torch/script.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <c10/core/InferenceMode.h>
#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>

#ifdef TERN_TORCH_CUDA
// Declared here rather than through ATen/cuda headers, which need the CUDA
// toolkit's headers: a function libtorch_cuda.so defines.
namespace at::cuda {
int warp_size();
}
#endif

#include <cstdlib>
#include <cstring>
#include <string>

namespace {
char* copy(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}
}  // namespace

extern "C" {

// The forward method's arguments after `self`, one per line as
// "<name>\t<type>", then "->\t<return type>"; NULL with *error set on failure.
char* tern_torch_forward_schema(const char* path, char** error) {
  try {
    torch::jit::Module m = torch::jit::load(path, c10::Device(c10::kCPU));
    const c10::FunctionSchema& schema = m.get_method("forward").function().getSchema();
    std::string out;
    const auto& args = schema.arguments();
    for (size_t i = 1; i < args.size(); ++i) {
      out += args[i].name();
      out += '\t';
      out += args[i].type()->annotation_str();
      out += '\n';
    }
    out += "->\t";
    for (size_t i = 0; i < schema.returns().size(); ++i) {
      if (i) out += ", ";
      out += schema.returns()[i].type()->annotation_str();
    }
    out += '\n';
    return copy(out);
  } catch (const std::exception& e) {
    *error = copy(e.what());
    return nullptr;
  }
}

void tern_torch_free(char* p) { std::free(p); }

// Enters c10::InferenceMode on this thread until tern_torch_inference_mode_exit.
void* tern_torch_inference_mode_enter() {
  try {
    return new c10::InferenceMode(true);
  } catch (...) {
    return nullptr;
  }
}

void tern_torch_inference_mode_exit(void* guard) { delete static_cast<c10::InferenceMode*>(guard); }

// Sets the profiling (true) or legacy (false) JIT executor, process-wide.
void tern_torch_set_executor_mode(int profiling) { torch::jit::getExecutorMode() = profiling != 0; }

// Lets LibTorch use cuDNN (1) or not (0) (DISABLE_CUDNN).
void tern_torch_set_cudnn(int enabled) { at::globalContext().setUserEnabledCuDNN(enabled != 0); }

// Releases the accelerator caching allocator's unused blocks (CUDA's when it
// is linked); 0 when there is no accelerator.
int tern_torch_empty_cuda_cache() {
  try {
    at::accelerator::emptyCache();
    return 1;
  } catch (...) {
    return 0;
  }
}

// A reference into libtorch_cuda, so that the linker's --as-needed keeps it
// (LibTorch registers its CUDA backend from that library's initialisers).
#ifdef TERN_TORCH_CUDA
int (*volatile tern_torch_cuda_anchor)() = &at::cuda::warp_size;
#endif

int tern_torch_cuda_linked() {
#ifdef TERN_TORCH_CUDA
  return tern_torch_cuda_anchor != nullptr;
#else
  return 0;
#endif
}
}
