// aoti_score: load an AOTInductor package and time reward/critic scoring calls from C++, with no Python
// anywhere in the process.
//
//   aoti_score PACKAGE.pt2 INPUTS OUT_JSON [--warmup N] [--iters N] [--device cpu|cuda|cuda:N] [--threads N]
//
// PACKAGE.pt2 comes from torch._inductor.aoti_compile_and_package on a module whose forward takes
// (input_ids, attention_mask) and returns one tensor: the scores [batch].
//
// INPUTS is a small raw tensor file written by calibrate/runtimes/aoti_cpp.py (little-endian):
//   bytes 0..7   magic "RLHFTEN1"
//   uint32       number of tensors
//   per tensor:  uint32 dtype code (1 = int64, 2 = float32), uint32 ndim, int64 sizes[ndim],
//                then numel * itemsize bytes of C-contiguous data
// The file must end exactly after the last tensor. The tensors are the model's positional inputs, in order.
//
// Timing (all durations in seconds):
//   load_s        constructing the AOTIModelPackageLoader (unzip, dlopen, load weights)
//   first_call_s  the first run() after loading, host clock, device synchronised before and after
//   samples_s     one entry per call after `--warmup` untimed calls. CPU: std::chrono::steady_clock around
//                 each run(). CUDA: a pair of timing-enabled CUDA events recorded on the current stream
//                 around each run(), read after synchronising on the end event (kernel time per call,
//                 as torch.cuda.Event.elapsed_time measures it).
// Inputs are moved to the device before any timing, matching the Python runtimes (inputs on device).
//
// OUT_JSON gets {"first_call_s", "samples_s", "load_s", "device", "package_device", "torch", "threads",
// "warmup", "iters", "timer", "peak_rss_mb", "output_shape", "scores"}; "scores" is the last call's first output as
// float32, printed with 9 significant digits so that it reads back bit-exactly as float32.
//
// If the package metadata has "rlhfsim_inputs" (dtypes and static shapes), the inputs must match it.
//
// Errors: one line "aoti_score: error: ..." on stderr; exit code 2 for bad arguments, 1 otherwise.

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/core/Event.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// This process's peak resident set in MiB (VmHWM, Linux; -1 elsewhere). Read here, not by the parent from
// wait4's ru_maxrss, which keeps the high-water mark of the forked parent's pages across exec.
double peak_rss_mb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1.0;
}

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Args {
  std::string package, inputs, out_json;
  int warmup = 3;
  int iters = 10;
  std::string device = "cpu";
  int threads = 0;  // 0: leave libtorch's default
};

int parse_int(const std::string& flag, const std::string& value, int minimum) {
  std::size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || v < minimum) {
    throw UsageError(flag + ": expected an integer >= " + std::to_string(minimum) + ", got '" + value + "'");
  }
  return v;
}

Args parse_args(int argc, char** argv) {
  Args a;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(s + ": expected a value, got nothing");
      return argv[++i];
    };
    if (s == "--warmup") a.warmup = parse_int(s, value(), 0);
    else if (s == "--iters") a.iters = parse_int(s, value(), 1);
    else if (s == "--threads") a.threads = parse_int(s, value(), 0);
    else if (s == "--device") {
      a.device = value();
      const bool indexed = a.device.rfind("cuda:", 0) == 0 && a.device.size() > 5 &&
                           a.device.find_first_not_of("0123456789", 5) == std::string::npos;
      if (a.device != "cpu" && a.device != "cuda" && !indexed) {
        throw UsageError("--device: expected cpu, cuda or cuda:N, got '" + a.device + "'");
      }
    } else if (s.rfind("--", 0) == 0) throw UsageError("unknown option '" + s + "'");
    else positional.push_back(s);
  }
  if (positional.size() != 3) {
    throw UsageError("usage: aoti_score PACKAGE.pt2 INPUTS OUT_JSON [--warmup N] [--iters N] "
                     "[--device cpu|cuda|cuda:N] [--threads N] (got " + std::to_string(positional.size()) +
                     " positional arguments, expected 3)");
  }
  a.package = positional[0];
  a.inputs = positional[1];
  a.out_json = positional[2];
  return a;
}

template <typename T>
T read_pod(std::ifstream& f, const std::string& path, const char* what) {
  T v{};
  f.read(reinterpret_cast<char*>(&v), sizeof(T));
  if (!f) throw std::runtime_error("inputs file " + path + ": truncated while reading " + what);
  return v;
}

std::vector<at::Tensor> read_inputs(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("inputs file not found or unreadable: " + path);
  char magic[8];
  f.read(magic, 8);
  if (!f || std::memcmp(magic, "RLHFTEN1", 8) != 0) {
    throw std::runtime_error("inputs file " + path + ": expected magic RLHFTEN1");
  }
  const auto count = read_pod<uint32_t>(f, path, "tensor count");
  std::vector<at::Tensor> out;
  for (uint32_t t = 0; t < count; ++t) {
    const auto code = read_pod<uint32_t>(f, path, "dtype code");
    const auto ndim = read_pod<uint32_t>(f, path, "ndim");
    if (ndim > 8) throw std::runtime_error("inputs file " + path + ": tensor " + std::to_string(t) + " has ndim " + std::to_string(ndim) + " (expected <= 8)");
    std::vector<int64_t> sizes(ndim);
    for (auto& s : sizes) {
      s = read_pod<int64_t>(f, path, "size");
      if (s < 0) throw std::runtime_error("inputs file " + path + ": negative size");
    }
    at::ScalarType dtype;
    if (code == 1) dtype = at::kLong;
    else if (code == 2) dtype = at::kFloat;
    else throw std::runtime_error("inputs file " + path + ": tensor " + std::to_string(t) + " has dtype code " + std::to_string(code) + " (expected 1=int64 or 2=float32)");
    at::Tensor x = at::empty(sizes, at::TensorOptions().dtype(dtype));
    const auto nbytes = static_cast<std::streamsize>(x.numel() * x.element_size());
    f.read(static_cast<char*>(x.data_ptr()), nbytes);
    if (f.gcount() != nbytes) throw std::runtime_error("inputs file " + path + ": truncated data of tensor " + std::to_string(t));
    out.push_back(std::move(x));
  }
  if (f.peek() != std::char_traits<char>::eof()) {
    throw std::runtime_error("inputs file " + path + ": trailing bytes after " + std::to_string(count) + " tensors");
  }
  return out;
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') { o += '\\'; o += static_cast<char>(c); }
    else if (c < 0x20) { char buf[8]; std::snprintf(buf, sizeof buf, "\\u%04x", c); o += buf; }
    else o += static_cast<char>(c);
  }
  return o + "\"";
}

std::string json_number(double v, int digits = 17) {
  if (std::isnan(v)) return "NaN";  // Python's json module reads these tokens
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

// "int64[2,16];int64[2,16]": the signature calibrate/runtimes/aoti_cpp.py stores in the package metadata
// under "rlhfsim_inputs". AOTInductor does not check input shapes at run time (only with the env var
// AOTI_RUNTIME_CHECK_INPUTS=1, which would also add the check to every timed call), so check once here.
std::string signature(const std::vector<at::Tensor>& inputs) {
  std::string s;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    s += (i ? ";" : "");
    s += inputs[i].scalar_type() == at::kLong ? "int64[" : "float32[";
    for (int64_t d = 0; d < inputs[i].dim(); ++d) s += (d ? "," : "") + std::to_string(inputs[i].size(d));
    s += "]";
  }
  return s;
}

std::string first_line(const std::string& s) {
  const auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(const Args& a) {
  if (!std::filesystem::is_regular_file(a.package)) {
    throw std::runtime_error("package not found: " + a.package);
  }
  if (a.threads > 0) at::set_num_threads(a.threads);
  std::vector<at::Tensor> inputs = read_inputs(a.inputs);

  const bool cuda = a.device != "cpu";
  const c10::DeviceIndex index = a.device.size() > 5 ? static_cast<c10::DeviceIndex>(std::stoi(a.device.substr(5))) : 0;
  const c10::Device device = cuda ? c10::Device(c10::DeviceType::CUDA, index) : c10::Device(c10::DeviceType::CPU);
  // Device-generic guard: compiles against CPU-only headers, dispatches to the CUDA implementation that
  // libtorch_cuda registers when it is loaded.
  std::optional<c10::impl::VirtualGuardImpl> guard;
  if (cuda) {
    if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
      throw std::runtime_error("--device cuda: this libtorch has no CUDA support");
    }
    guard.emplace(c10::DeviceType::CUDA);
    guard->setDevice(device);  // the runner and the current stream below are then on --device's GPU
    for (auto& x : inputs) x = x.to(device);
  }
  auto sync = [&]() { if (guard) guard->synchronizeDevice(device.index()); };

  c10::InferenceMode inference;
  auto t0 = std::chrono::steady_clock::now();
  torch::inductor::AOTIModelPackageLoader loader(a.package, "model", false, 1, cuda ? device.index() : -1);
  const double load_s = seconds_since(t0);
  const auto metadata = loader.get_metadata();
  const auto dev_it = metadata.find("AOTI_DEVICE_KEY");
  const std::string package_device = dev_it == metadata.end() ? "unknown" : dev_it->second;
  if (package_device != "unknown" && package_device != (cuda ? "cuda" : "cpu")) {
    throw std::runtime_error("package " + a.package + " was compiled for device '" + package_device + "', got --device " + a.device);
  }

  const auto sig_it = metadata.find("rlhfsim_inputs");
  if (sig_it != metadata.end() && sig_it->second != signature(inputs)) {
    throw std::runtime_error("inputs " + signature(inputs) + " do not match the package, which was compiled for " + sig_it->second);
  }

  void* stream_handle = nullptr;
  std::optional<c10::Stream> stream;
  if (guard) {
    stream = guard->getStream(device);
    stream_handle = guard->getStreamNativeHandle(*stream);
  }

  sync();
  t0 = std::chrono::steady_clock::now();
  std::vector<at::Tensor> out = loader.run(inputs, stream_handle);
  sync();
  const double first_call_s = seconds_since(t0);
  if (out.empty()) throw std::runtime_error("package returned no outputs (expected the scores tensor)");

  for (int i = 0; i < a.warmup; ++i) out = loader.run(inputs, stream_handle);
  sync();

  std::vector<double> samples_s;
  samples_s.reserve(a.iters);
  if (guard) {
    c10::Event start(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    c10::Event end(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    for (int i = 0; i < a.iters; ++i) {
      start.record(*stream);
      out = loader.run(inputs, stream_handle);
      end.record(*stream);
      end.synchronize();
      samples_s.push_back(start.elapsedTime(end) / 1000.0);  // elapsedTime is in milliseconds
    }
  } else {
    for (int i = 0; i < a.iters; ++i) {
      t0 = std::chrono::steady_clock::now();
      out = loader.run(inputs, stream_handle);
      samples_s.push_back(seconds_since(t0));
    }
  }

  const at::Tensor scores = out[0].detach().to(at::kCPU).to(at::kFloat).contiguous();
  std::ostringstream js;
  js << "{\"first_call_s\": " << json_number(first_call_s) << ", \"samples_s\": [";
  for (std::size_t i = 0; i < samples_s.size(); ++i) js << (i ? ", " : "") << json_number(samples_s[i]);
  js << "], \"load_s\": " << json_number(load_s) << ", \"device\": " << json_string(a.device)
     << ", \"package_device\": " << json_string(package_device) << ", \"torch\": " << json_string(TORCH_VERSION)
     << ", \"threads\": " << at::get_num_threads() << ", \"warmup\": " << a.warmup << ", \"iters\": " << a.iters
     << ", \"timer\": " << json_string(guard ? "cuda_event" : "steady_clock") << ", \"num_outputs\": " << out.size()
     << ", \"peak_rss_mb\": " << json_number(peak_rss_mb())
     << ", \"output_shape\": [";
  for (int64_t d = 0; d < scores.dim(); ++d) js << (d ? ", " : "") << scores.size(d);
  js << "], \"scores\": [";
  const float* p = scores.data_ptr<float>();
  for (int64_t i = 0; i < scores.numel(); ++i) js << (i ? ", " : "") << json_number(p[i], 9);
  js << "]}\n";

  const std::string tmp = a.out_json + ".tmp";
  {
    std::ofstream f(tmp);
    f << js.str();
    if (!f) throw std::runtime_error("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, a.out_json);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const UsageError& e) {
    std::cerr << "aoti_score: error: " << e.what() << std::endl;
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "aoti_score: error: " << first_line(e.what_without_backtrace()) << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "aoti_score: error: " << first_line(e.what()) << std::endl;
    return 1;
  }
}
