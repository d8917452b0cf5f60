// farm's native TVM RPC server: a small program linked against TVM's C++ runtime that
// registers with a TVM tracker and serves RPC sessions. Built for aarch64 and run under
// qemu-user, it is the emulated board farm's tests and demos use (farm/devices/emulated.py).
//
// It speaks the tracker protocol (magic 0x2F271, [int32 len][json] frames) and the RPC
// handshake (magic 0xFF271, key exchange), then hands the socket to the runtime's own
// `rpc.ServerLoop`. Each session runs in a forked child, so a crash in a model ends only
// that session, and a `-timeout=N` from the client is enforced by killing the child.
//
// Device runtimes found beside the executable are loaded at start, as are those named with --load:
// - libtvm_runtime_opencl.so, TVM's OpenCL runtime built with its opencl_wrapper, which opens the phone's
//   libOpenCL.so at first use;
// - libtvm_runtime_cuda.so, the apache-tvm wheel's CUDA runtime, with PyPI's libcudart.so.13 beside it (a CUDA
//   bundle: farm/devices/native.py, ensure_native_server(cuda=True)). It needs the NVIDIA driver's libcuda.so.1;
//   on a host without one the server logs "CUDA runtime not loaded: <the loader's words>; CUDA sessions will be
//   refused", still serves CPU sessions, and a session that asks for a CUDA device (device_api.cuda, cuda_host)
//   or loads a library with CUDA code in it (ffi.Module.load_from_bytes.cuda) gets an error that says so:
//   "no CUDA device on this server (key K): libcuda.so.1: cannot open shared object file: ... (the NVIDIA driver
//   is not installed)". Without these, TVM would say "Device API cuda is not enabled", or that no loader of
//   that name is registered. With the driver but no GPU the runtime loads, and TVM's own CUDA errors apply.
// Sessions also get, as farm's Python server offers them (farm/rpc/server.py):
// - farm.WallTimeEvaluator: per-call wall time on the device, each call followed by a device sync (on
//   OpenCL TVM's own timer sums kernel events);
// - farm.ClearKernelCache: empties the driver's on-disk kernel cache, --kernel-cache DIR, which the
//   server names to the driver (POCL_CACHE_DIR, CUDA_CACHE_PATH) before any session starts, so a cold
//   measurement really builds its kernels; TVM's own programs live in the session's child and die with it;
// - farm.MemoryStats(reset_peak): the serving process's memory as JSON {"rss_bytes", "peak_bytes",
//   "total_bytes", "peak_reset"} from /proc (VmRSS, VmHWM, MemTotal); then, if reset_peak, the peak is
//   reset (5 > /proc/self/clear_refs; "peak_reset" says whether that worked). Each session is a forked
//   child, so this is the model's process;
// - farm.ThreadsSet(): the CPU threads this server gave TVM (--threads N, default the CPUs online here), set as
//   TVM_NUM_THREADS before any session forks, so each session's thread pool is sized by it and not by TVM's
//   default (half the CPUs on x86). A run stores what the session reports (runtime.NumThreads);
// - farm.KernelProfile(module, dev_type, dev_id, runs, inputs...): where the time goes, each call of the module's
//   main timed between device syncs in this process, as JSON (farm/measure/profile.py); on a GPU with an event
//   timer (runtime.timer.opencl, .cuda) each kernel on that timer instead;
// - farm.DeviceRuntimes(): which device runtimes this server has, as JSON {"cuda": "loaded", "opencl": "not
//   loaded: <why>"}, so a client can tell a server without a GPU runtime from one whose GPU is busy or broken;
// - farm.ServerBuild(): what this binary was built from (FARM_SERVER_BUILD, set by farm's build: the source's
//   digest and the TVM wheels' versions), a field of each run's manifest (farm/manifest.py).
//
// usage: farm-rpc-server --tracker HOST:PORT --key KEY [--host 127.0.0.1] [--port 9090] [--load LIB]...
//                        [--kernel-cache DIR] [--threads N]

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <tvm/ffi/device.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#ifndef FARM_SERVER_BUILD
#define FARM_SERVER_BUILD ""  // built outside farm: its build is not known (a run's manifest leaves it out)
#endif

namespace {

constexpr int32_t kRPCMagic = 0xFF271;
constexpr int32_t kRPCMismatch = 0xFF271 + 2;
constexpr int32_t kTrackerMagic = 0x2F271;
constexpr int kPut = 3, kUpdateInfo = 5, kGetPendingMatchkeys = 7;

std::string g_workdir;
std::string g_kernel_cache;
std::string g_key;
// Why each device runtime is not loaded ("" when it is): the loader's words and what they mean; set at start.
std::string g_cuda_missing, g_opencl_missing;

void Log(const std::string& msg) {
  std::fprintf(stderr, "farm-rpc-server: %s\n", msg.c_str());
  std::fflush(stderr);
}

[[noreturn]] void Die(const std::string& msg) {
  Log("error: " + msg);
  std::exit(1);
}

bool SendAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) {
      if (k < 0 && errno == EINTR) continue;
      return false;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool RecvAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = recv(fd, p, n, 0);
    if (k <= 0) {
      if (k < 0 && errno == EINTR) continue;
      return false;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool SendInt(int fd, int32_t v) { return SendAll(fd, &v, 4); }
bool RecvInt(int fd, int32_t* v) { return RecvAll(fd, v, 4); }

bool SendJson(int fd, const std::string& json) {
  return SendInt(fd, static_cast<int32_t>(json.size())) && SendAll(fd, json.data(), json.size());
}

bool RecvJson(int fd, std::string* out) {
  int32_t len;
  if (!RecvInt(fd, &len) || len < 0 || len > (1 << 24)) return false;
  out->assign(static_cast<size_t>(len), '\0');
  return RecvAll(fd, out->data(), out->size());
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

int ConnectTcp(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  return fd;
}

// Connect to the tracker, say who we are; -1 when it is not there (yet).
int ConnectTracker(const std::string& host, int port, const std::string& key, int server_port) {
  int fd = ConnectTcp(host, port);
  if (fd < 0) return -1;
  int32_t magic = 0;
  std::string reply;
  std::string info = "[" + std::to_string(kUpdateInfo) + ", {\"key\": " + Quote("server:" + key) +
                     ", \"addr\": [null, " + std::to_string(server_port) + "]}]";
  if (!SendInt(fd, kTrackerMagic) || !RecvInt(fd, &magic) || magic != kTrackerMagic ||
      !SendJson(fd, info) || !RecvJson(fd, &reply) || reply != "0") {
    close(fd);
    Die(host + ":" + std::to_string(port) + " is not a TVM RPC tracker");
  }
  return fd;
}

bool PutKey(int tracker, const std::string& key, int server_port, const std::string& matchkey) {
  std::string reply;
  std::string put = "[" + std::to_string(kPut) + ", " + Quote(key) + ", [" + std::to_string(server_port) +
                    ", " + Quote(matchkey) + "], null]";
  return SendJson(tracker, put) && RecvJson(tracker, &reply) && reply == "0";
}

std::string NewMatchkey(const std::string& key) {
  static std::mt19937_64 rng(std::random_device{}());
  return key + ":" + std::to_string(std::uniform_real_distribution<double>(0, 1)(rng));
}

int ListenOn(const std::string& host, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) Die("--host must be an IPv4 address: " + host);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    Die("cannot bind " + host + ":" + std::to_string(port) + ": " + std::strerror(errno));
  if (listen(fd, 8) != 0) Die(std::string("listen: ") + std::strerror(errno));
  return fd;
}

// RPC handshake: the client sends magic, then "client:MATCHKEY [-timeout=N]".
// Returns the session timeout in seconds (0 = none), or -1 when the client is not ours.
int Handshake(int conn, const std::string& key, const std::string& matchkey) {
  int32_t magic = 0, len = 0;
  if (!RecvInt(conn, &magic) || magic != kRPCMagic || !RecvInt(conn, &len) || len < 0 || len > 4096) return -1;
  std::string client(static_cast<size_t>(len), '\0');
  if (!RecvAll(conn, client.data(), client.size())) return -1;
  std::string head = client.substr(0, client.find(' '));
  if (head != "client:" + matchkey) {
    SendInt(conn, kRPCMismatch);
    return -1;
  }
  std::string server_key = "server:" + key;
  if (!SendInt(conn, kRPCMagic) || !SendJson(conn, server_key)) return -1;
  size_t at = client.find("-timeout=");
  return at == std::string::npos ? 0 : std::atoi(client.c_str() + at + 9);
}

// Load a device runtime into the process before any session forks from it: "" when loaded, else the loader's words.
std::string LoadRuntime(const std::string& path) {
  if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) return dlerror();
  Log("loaded " + path);
  return "";
}

// Why the CUDA runtime did not load: the loader's words, and what they mean when a library was not found.
std::string CudaMissing(const std::string& said) {
  auto absent = [&said](const std::string& lib) {
    return said.find(lib + ": cannot open shared object file") != std::string::npos;
  };
  if (absent("libcuda.so.1")) return said + " (the NVIDIA driver is not installed)";
  if (absent("libcudart.so.13"))
    return said + " (CUDA's runtime library is not beside the server, where a CUDA bundle carries it)";
  if (absent("libtvm_runtime_cuda.so")) return said + " (this server was built without CUDA support)";
  return said;
}

// A device runtime's state for farm.DeviceRuntimes.
std::string RuntimeState(const std::string& missing) { return missing.empty() ? "loaded" : "not loaded: " + missing; }

// In a session on a server without the CUDA runtime: what a client's CUDA device or CUDA module calls, refused
// with the reason (TVM's DeviceAPI manager calls device_api.<name>; a library's CUDA import, its loader).
void RefuseCuda() {
  namespace ffi = tvm::ffi;
  ffi::Function refuse = ffi::Function::FromPacked([](ffi::PackedArgs, ffi::Any*) {
    TVM_FFI_THROW(RuntimeError) << "no CUDA device on this server (key " << g_key << "): " << g_cuda_missing;
  });
  for (const char* name : {"device_api.cuda", "device_api.cuda_host", "ffi.Module.load_from_bytes.cuda"}) {
    ffi::Function::SetGlobal(name, refuse, true);
  }
}

void SyncDevice(DLDevice dev) {
  static auto sync = tvm::ffi::Function::GetGlobal("runtime.Device_StreamSync");
  if (sync) (*sync)(dev, static_cast<int64_t>(0));
}

// farm.WallTimeEvaluator(mod, name, dev_type, dev_id, number, repeat) -> timer(args...) -> bytes of
// `repeat` doubles: the mean wall time of `number` calls, each followed by a device sync. One call
// before, as TVM's evaluator does, is not timed.
tvm::ffi::Function WallTimeEvaluator(tvm::ffi::Module mod, tvm::ffi::String name, int dev_type, int dev_id,
                                     int number, int repeat) {
  namespace ffi = tvm::ffi;
  auto found = mod->GetFunction(name);
  if (!found.has_value()) Log("WallTimeEvaluator: no function " + std::string(name));
  ffi::Function func = found.value();
  DLDevice dev{static_cast<DLDeviceType>(dev_type), dev_id};
  return ffi::Function::FromPacked([func, dev, number, repeat](ffi::PackedArgs args, ffi::Any* rv) {
    ffi::Any unused;
    func.CallPacked(args.data(), args.size(), &unused);
    SyncDevice(dev);
    std::vector<double> values;
    for (int r = 0; r < repeat; ++r) {
      auto start = std::chrono::steady_clock::now();
      for (int n = 0; n < number; ++n) {
        func.CallPacked(args.data(), args.size(), &unused);
        SyncDevice(dev);
      }
      std::chrono::duration<double> spent = std::chrono::steady_clock::now() - start;
      values.push_back(spent.count() / number);
    }
    *rv = ffi::Bytes(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double));
  });
}

// The name of a GPU's own timer (runtime.timer.<name>) where this process has it registered (its runtime loaded).
std::string DeviceTimer(DLDeviceType type) {
  const char* name = type == kDLCUDA     ? "cuda"
                     : type == kDLOpenCL ? "opencl"
                     : type == kDLVulkan ? "vulkan"
                     : type == kDLMetal  ? "metal"
                     : type == kDLROCM   ? "rocm"
                                         : "";
  if (!*name || !tvm::ffi::Function::GetGlobal(std::string("runtime.timer.") + name)) return "";
  return name;
}

// Seconds per call of each kernel (symbol -> its first call's arguments) on the device's own timer: the median of
// `runs` repeats of one call by TVM's time_evaluator (one call before, not counted), where a module the executable
// imports holds the kernel; the VM's calls are held by none. As farm/rpc/server.py's kernel_device_times.
std::map<std::string, double> KernelDeviceTimes(tvm::ffi::Module executable, DLDevice dev, int runs,
                                                const std::map<std::string, std::vector<tvm::ffi::Any>>& first) {
  namespace ffi = tvm::ffi;
  static auto evaluator = ffi::Function::GetGlobal("runtime.RPCTimeEvaluator");
  std::map<std::string, double> seconds;
  if (!evaluator) return seconds;
  int repeat = runs > 0 ? runs : 1;
  for (const auto& [symbol, args] : first) {
    for (const ffi::Any& imported : executable->imports()) {
      ffi::Module holder = imported.cast<ffi::Module>();
      if (!holder->ImplementsFunction(symbol, true)) continue;
      ffi::Function timed = (*evaluator)(holder, symbol, static_cast<int>(dev.device_type), dev.device_id, 1, repeat,
                                         0, 100, 0, 1, 0, ffi::String("")).cast<ffi::Function>();
      std::vector<ffi::AnyView> views(args.begin(), args.end());
      ffi::Any blob;
      timed.CallPacked(views.data(), static_cast<int32_t>(views.size()), &blob);
      ffi::Bytes bytes = blob.cast<ffi::Bytes>();
      const double* values = reinterpret_cast<const double*>(bytes.data());
      std::vector<double> sorted(values, values + bytes.size() / sizeof(double));
      std::sort(sorted.begin(), sorted.end());
      size_t n = sorted.size();
      if (n) seconds[symbol] = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
      break;
    }
  }
  return seconds;
}

// farm.KernelProfile(module, dev_type, dev_id, runs, inputs...) -> JSON, as farm's Python server answers it
// (farm/rpc/server.py): the module's main run `runs` times (after one not counted; runs 0: the first run, counted) under a VM instrument that syncs
// the device and reads the clock around each call, here in the session's process; sums over the runs. On a GPU
// with an event timer each kernel's time is its own on that timer (KernelDeviceTimes).
void KernelProfile(tvm::ffi::PackedArgs args, tvm::ffi::Any* rv) {
  namespace ffi = tvm::ffi;
  using Clock = std::chrono::steady_clock;
  ffi::Module executable = args[0].cast<ffi::Module>();
  DLDevice dev{static_cast<DLDeviceType>(args[1].cast<int>()), args[2].cast<int>()};
  int runs = args[3].cast<int>();
  ffi::Module vm = executable->GetFunction("vm_load_executable").value()().cast<ffi::Module>();
  constexpr int kPooled = 2;  // the VM's pooled allocator, as TVM's Python VirtualMachine chooses by default
  ffi::Function init = vm->GetFunction("vm_initialization").value();
  if (dev.device_type == kDLCPU) {
    init(static_cast<int>(dev.device_type), dev.device_id, kPooled);
  } else {  // the CPU runs the shape functions
    init(static_cast<int>(dev.device_type), dev.device_id, kPooled, static_cast<int>(kDLCPU), 0, kPooled);
  }
  std::string timer = DeviceTimer(dev.device_type);
  bool capture = !timer.empty();
  std::vector<std::string> order;
  std::map<std::string, double> seconds;
  std::map<std::string, int64_t> calls;
  std::map<std::string, Clock::time_point> started;
  std::map<std::string, std::vector<ffi::Any>> first_calls;
  ffi::Function instrument = ffi::Function::FromPacked([&](ffi::PackedArgs call, ffi::Any* ret) {
    SyncDevice(dev);
    Clock::time_point now = Clock::now();
    std::string symbol = call[1].cast<ffi::String>();
    if (call[2].cast<bool>()) {
      started[symbol] = now;
      if (capture && !first_calls.count(symbol)) {
        std::vector<ffi::Any>& kept = first_calls[symbol];
        for (int i = 4; i < call.size(); ++i) kept.push_back(call[i]);
      }
    } else {
      if (!calls.count(symbol)) order.push_back(symbol);
      seconds[symbol] += std::chrono::duration<double>(now - started[symbol]).count();
      calls[symbol] += 1;
    }
    *ret = 0;
  });
  vm->GetFunction("set_instrument").value()(instrument);
  ffi::Function main_func = vm->GetFunction("main").value();
  ffi::Any unused;
  bool count_first = runs == 0;  // runs 0: one run, the first, counted (a slow model's profile within its share)
  if (count_first) runs = 1;
  SyncDevice(dev);
  Clock::time_point first_begun = Clock::now();
  main_func.CallPacked(args.data() + 4, args.size() - 4, &unused);  // else not counted: the first run allocates
  SyncDevice(dev);
  double main_s = std::chrono::duration<double>(Clock::now() - first_begun).count();
  capture = false;
  std::map<std::string, double> on_device = KernelDeviceTimes(executable, dev, runs, first_calls);
  first_calls.clear();  // the first run's tensors go back to the VM's pool before the counted runs
  if (!count_first) {
    order.clear();
    seconds.clear();
    calls.clear();
    SyncDevice(dev);
    Clock::time_point begun = Clock::now();
    for (int r = 0; r < runs; ++r) main_func.CallPacked(args.data() + 4, args.size() - 4, &unused);
    SyncDevice(dev);
    main_s = std::chrono::duration<double>(Clock::now() - begun).count();
  }
  vm->GetFunction("set_instrument").value()(ffi::Function(nullptr));
  for (const auto& [symbol, per_call] : on_device) seconds[symbol] = per_call * calls[symbol];
  std::string clock = on_device.empty() ? "wall, the device synced before and after each call"
                                        : "device: each kernel on the " + timer +
                                              " event timer (TVM's time_evaluator, on its first call's own arguments,"
                                              " as often as the runs); the VM's calls and main wall, the device synced"
                                              " around each call";
  if (count_first) clock += "; the first run, counted (runs 0)";  // as farm's Python server says it
  std::ostringstream json;
  json.precision(17);
  json << "{\"clock\": " << Quote(clock) << ", \"runs\": " << runs
       << ", \"main_s\": " << main_s << ", \"kernels\": [";
  for (size_t i = 0; i < order.size(); ++i) {
    json << (i ? ", " : "") << "{\"name\": " << Quote(order[i]) << ", \"calls\": " << calls[order[i]]
         << ", \"time_s\": " << seconds[order[i]] << "}";
  }
  json << "]}";
  *rv = ffi::String(json.str());
}

// The driver's kernel cache folder, emptied (and made again); the folder's name, "" when there is none.
std::string ClearKernelCache() {
  if (g_kernel_cache.empty()) return "";
  std::string clear = "rm -rf '" + g_kernel_cache + "' && mkdir -p '" + g_kernel_cache + "'";
  if (std::system(clear.c_str()) != 0) Log("could not clear the kernel cache " + g_kernel_cache);
  return g_kernel_cache;
}

// A "Name:   123 kB" line's value in bytes from a /proc file; -1 when absent.
int64_t ProcKilobytes(const std::string& path, const std::string& name) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + ":", 0) == 0) {
      std::istringstream fields(line.substr(name.size() + 1));
      int64_t kb = -1;
      fields >> kb;
      return kb < 0 ? -1 : kb * 1024;
    }
  }
  return -1;
}

std::string JsonBytes(int64_t value) { return value < 0 ? "null" : std::to_string(value); }

std::string MemoryStats(int reset_peak) {
  std::string stats = "{\"rss_bytes\": " + JsonBytes(ProcKilobytes("/proc/self/status", "VmRSS")) +
                      ", \"peak_bytes\": " + JsonBytes(ProcKilobytes("/proc/self/status", "VmHWM")) +
                      ", \"total_bytes\": " + JsonBytes(ProcKilobytes("/proc/meminfo", "MemTotal"));
  bool reset = false;
  if (reset_peak != 0) {  // a kernel without clear_refs: the peak is then not measured (farm says so)
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    clear.flush();
    reset = clear.good();
  }
  return stats + ", \"peak_reset\": " + (reset ? "true" : "false") + "}";
}

int g_threads = 0;  // --threads, or the CPUs online here

void RegisterServerEnv() {
  namespace ffi = tvm::ffi;
  ffi::Function::SetGlobal("farm.ThreadsSet", ffi::Function::FromTyped([]() -> int { return g_threads; }), true);
  ffi::Function::SetGlobal("farm.ServerBuild", ffi::Function::FromTyped([]() -> ffi::String {
    return FARM_SERVER_BUILD;
  }), true);
  ffi::Function::SetGlobal("farm.DeviceRuntimes", ffi::Function::FromTyped([]() -> ffi::String {
    return "{\"cuda\": " + Quote(RuntimeState(g_cuda_missing)) + ", \"opencl\": " +
           Quote(RuntimeState(g_opencl_missing)) + "}";
  }), true);
  if (!g_cuda_missing.empty()) RefuseCuda();
  ffi::Function::SetGlobal("farm.WallTimeEvaluator", ffi::Function::FromTyped(WallTimeEvaluator), true);
  ffi::Function::SetGlobal("farm.KernelProfile", ffi::Function::FromPacked(KernelProfile), true);
  ffi::Function::SetGlobal("farm.ClearKernelCache",
                           ffi::Function::FromTyped([]() -> ffi::String { return ClearKernelCache(); }), true);
  ffi::Function::SetGlobal("farm.MemoryStats",
                           ffi::Function::FromTyped([](int reset) -> ffi::String { return MemoryStats(reset); }), true);
  ffi::Function::SetGlobal(
      "tvm.rpc.server.workpath",
      ffi::Function::FromTyped([](ffi::String path) -> ffi::String { return g_workdir + "/" + std::string(path); }),
      true);
  ffi::Function::SetGlobal(
      "tvm.rpc.server.load_module",
      ffi::Function::FromTyped([](ffi::String path) -> ffi::Module {
        return ffi::Module::LoadFromFile(g_workdir + "/" + std::string(path));
      }),
      true);
}

// Serve one session in a child; the parent waits, killing the child after the timeout.
void Serve(int conn, int timeout_s) {
  char tmpl[] = "/tmp/farm-rpc-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Die(std::string("mkdtemp: ") + std::strerror(errno));
  g_workdir = tmpl;
  pid_t child = fork();
  if (child == 0) {
    RegisterServerEnv();
    auto loop = tvm::ffi::Function::GetGlobal("rpc.ServerLoop");
    if (!loop) Die("the TVM runtime has no rpc.ServerLoop");
    (*loop)(conn);
    _exit(0);
  }
  close(conn);
  auto start = std::chrono::steady_clock::now();
  int status = 0;
  while (waitpid(child, &status, WNOHANG) == 0) {
    if (timeout_s > 0 && std::chrono::steady_clock::now() - start > std::chrono::seconds(timeout_s)) {
      Log("session timed out after " + std::to_string(timeout_s) + " s");
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string cleanup = std::string("rm -rf '") + tmpl + "'";
  if (std::system(cleanup.c_str()) != 0) Log("could not remove " + std::string(tmpl));
}

}  // namespace

constexpr const char* kUsage =
    "--tracker HOST:PORT --key KEY [--host H] [--port P] [--load LIB]... [--kernel-cache DIR] [--threads N]";

int main(int argc, char** argv) {
  std::string tracker_host, key, host = "127.0.0.1";
  int tracker_port = 0, port = 9090;
  std::vector<std::string> loads;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--tracker") {
      size_t colon = value.rfind(':');
      if (colon == std::string::npos) Die("--tracker must be HOST:PORT");
      tracker_host = value.substr(0, colon);
      tracker_port = std::atoi(value.c_str() + colon + 1);
    } else if (flag == "--key") {
      key = g_key = value;
    } else if (flag == "--host") {
      host = value;
    } else if (flag == "--port") {
      port = std::atoi(value.c_str());
    } else if (flag == "--load") {
      loads.push_back(value);
    } else if (flag == "--kernel-cache") {
      g_kernel_cache = value;
    } else if (flag == "--threads") {
      g_threads = std::atoi(value.c_str());
      if (g_threads < 1) Die("--threads must be a whole number >= 1");
    } else {
      Die("unknown option " + flag + " (usage: " + kUsage + ")");
    }
  }
  if (tracker_host.empty() || key.empty()) Die(std::string("usage: ") + kUsage);
  if (g_threads == 0) g_threads = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  setenv("TVM_NUM_THREADS", std::to_string(g_threads).c_str(), 1);  // before any session: each child inherits it
  if (!g_kernel_cache.empty()) {  // before any driver starts: the children inherit it
    ClearKernelCache();
    setenv("POCL_CACHE_DIR", g_kernel_cache.c_str(), 1);
    setenv("CUDA_CACHE_PATH", g_kernel_cache.c_str(), 1);
  }
  std::string self = argv[0];
  std::string here = self.find('/') == std::string::npos ? "." : self.substr(0, self.rfind('/'));
  g_opencl_missing = LoadRuntime(here + "/libtvm_runtime_opencl.so");  // absent on CPU-only bundles
  g_cuda_missing = CudaMissing(LoadRuntime(here + "/libtvm_runtime_cuda.so"));  // on CUDA bundles; needs the driver
  for (const std::string& lib : loads) {
    std::string said = LoadRuntime(lib);
    if (!said.empty()) Die("cannot load " + lib + ": " + said);
  }
  // a runtime named with --load counts as loaded: what a session finds is what decides
  if (tvm::ffi::Function::GetGlobal("device_api.opencl")) g_opencl_missing.clear();
  if (tvm::ffi::Function::GetGlobal("device_api.cuda")) g_cuda_missing.clear();
  // said only by a CUDA bundle: a server built without CUDA (boards, phones, fleets) refuses CUDA just as well, quietly
  if (!g_cuda_missing.empty() && access((here + "/libtvm_runtime_cuda.so").c_str(), F_OK) == 0)
    Log("CUDA runtime not loaded: " + g_cuda_missing + "; CUDA sessions will be refused");
  signal(SIGPIPE, SIG_IGN);
  int listener = ListenOn(host, port);
  Log("listening on " + host + ":" + std::to_string(port) + ", key " + key);
  int tracker = -1;
  while (true) {
    while (tracker < 0) {
      tracker = ConnectTracker(tracker_host, tracker_port, key, port);
      if (tracker < 0) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    std::string matchkey = NewMatchkey(key);
    if (!PutKey(tracker, key, port, matchkey)) {
      close(tracker);
      tracker = -1;
      continue;
    }
    // Wait for our client; like TVM's server, re-register when the tracker handed our
    // key to a client that never came.
    int unmatched_s = 0;
    int conn = -1;
    bool tracker_lost = false;
    while (conn < 0) {
      fd_set fds;
      FD_ZERO(&fds);
      FD_SET(listener, &fds);
      timeval tv{2, 0};
      int ready = select(listener + 1, &fds, nullptr, nullptr, &tv);
      if (ready > 0) {
        int c = accept(listener, nullptr, nullptr);
        if (c < 0) continue;
        int timeout_s = Handshake(c, key, matchkey);
        if (timeout_s < 0) {
          close(c);
          continue;
        }
        Serve(c, timeout_s);
        conn = c;
        break;
      }
      std::string pending;
      if (!SendJson(tracker, "[" + std::to_string(kGetPendingMatchkeys) + "]") || !RecvJson(tracker, &pending)) {
        tracker_lost = true;
        break;
      }
      unmatched_s = pending.find(Quote(matchkey)) == std::string::npos ? unmatched_s + 2 : 0;
      if (unmatched_s > 6) {
        matchkey = NewMatchkey(key);
        if (!PutKey(tracker, key, port, matchkey)) {
          tracker_lost = true;
          break;
        }
        unmatched_s = 0;
      }
    }
    if (tracker_lost) {
      Log("lost the tracker; reconnecting");
      close(tracker);
      tracker = -1;
    }
  }
}
