// The report of a rank's run as JSON, and where it ran.
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include "laga/cuda.hpp"
#include "laga/measure.hpp"
#include "laga_build_commit.hpp"

#ifndef LAGA_BUILD_TYPE
#define LAGA_BUILD_TYPE ""
#endif

namespace laga {

using nlohmann::json;

json options_report(const BlockOptions& opts) {
  return {{"variant", variant_of(opts).label()},
          {"form", form_name(opts.form)},
          {"layout", layout_name(opts.layout)},
          {"kernel", kernel_name(opts.kernel)},
          {"recompute", recompute_name(opts.recompute)},
          {"absorbed_attention", absorbed_attention_name(opts.absorbed_attention)},
          {"dtype", dtype_name(opts.dtype)},
          {"kv_grad_reduce_in_fp32", opts.kv_grad_reduce_fp32},
          {"grad_dtype", dtype_name(grad_dtype(opts))},
          {"accumulate_grads", opts.accumulate_grads},
          {"overlap", opts.overlap}};
}

json check_report(const std::vector<CheckResult>& checks) {
  json out = json::array();
  for (const CheckResult& c : checks) {
    json rows = json::array();
    for (const TensorCheck& t : c.tensors) rows.push_back({{"tensor", t.tensor}, {"rel_error", t.rel_error}, {"ok", t.ok}});
    out.push_back({{"reference", check_reference_name(c.reference)}, {"tolerance", c.tolerance}, {"tensors", rows}});
  }
  return out;
}

json run_report(const BlockOptions& opts, const std::vector<json>& ranks, const std::vector<CheckResult>* checks,
                Backend& be) {
  json entry = options_report(opts);
  entry["ranks"] = ranks;
  if (checks) entry["check"] = check_report(*checks);
  if (be.device() == Device::Cuda) entry["attention_calls"] = attention_calls_report(be);
  return entry;
}

nlohmann::ordered_json bench_point_report(const BenchPoint& p, const TimeModel& model, int repeat, int warmup,
                                          int gpu, Backend& be) {
  using ojson = nlohmann::ordered_json;
  ojson doc = {{"seq", p.seq}, {"sp", p.sp}, {"batch", p.batch}, {"variant_id", variant_id(variant_of(p.opts))},
               {"rank", p.rank}, {"ranks_run", p.ranks_run}};
  std::vector<json> ranks;
  for (std::size_t i = 0; i < p.runs.size(); ++i) {
    const int r = p.runs.size() == 1 ? p.rank : int(i);
    ranks.push_back(rank_report(p.runs[i], r, r == p.rank ? p.memory : DeviceMemory{}, gpu));
  }
  doc.update(ojson(run_report(p.opts, ranks, p.checks ? &*p.checks : nullptr, be)));
  doc["repeats"] = repeats_report(p.repeats, p.rank, warmup);
  doc["modeled"] = modeled_report(model, p.sp, p.run().traffic, p.reps());
  if (p.bit_identical_to_explicit) doc["bit_identical_to_explicit"] = *p.bit_identical_to_explicit;
  if (p.gemm_check) doc["gemms"] = gemms_report(p.gemms, p.gemm_records, repeat, std::max(1, warmup));
  if (p.op_profile) doc["ops"] = ops_report(p.op_records, repeat);
  if (!p.timed.empty()) doc["exposed_communication"] = exposed_report(model, p.sp, p.run().traffic, p.reps(), p.timed);
  return doc;
}

nlohmann::ordered_json bench_document(Device device, nlohmann::ordered_json config, const TimeModel& model) {
  using ojson = nlohmann::ordered_json;
  const std::time_t t = std::time(nullptr);
  char generated[32];
  std::strftime(generated, sizeof generated, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  json machine = machine_inventory();
  if (device == Device::Cuda) machine["cudnn"] = cudnn_report();
  return {{"schema", kBenchSchema},     {"generated", generated},          {"complete", false},
          {"machine", ojson(machine)},  {"build", ojson(build_report())},  {"config", std::move(config)},
          {"time_model", ojson(time_model_json(model))}, {"points", ojson::array()}};
}

std::vector<json> gather_reports(Communicator& host, const json& mine) {
  const std::string text = mine.dump();
  const int P = host.size();
  if (P == 1) return {mine};
  double len = double(text.size());
  std::vector<double> lens(P);
  host.all_gather(&len, lens.data(), 1, DType::F64);
  std::size_t longest = 0;
  for (double l : lens) longest = std::max(longest, std::size_t(l));
  const std::size_t words = std::max<std::size_t>(1, (longest + sizeof(double) - 1) / sizeof(double));
  std::vector<double> buf(words, 0.0), all(words * P);
  std::memcpy(buf.data(), text.data(), text.size());
  host.all_gather(buf.data(), all.data(), words, DType::F64);
  std::vector<json> out;
  for (int r = 0; r < P; ++r)
    out.push_back(json::parse(std::string(reinterpret_cast<const char*>(all.data() + std::size_t(r) * words),
                                          std::size_t(lens[r]))));
  return out;
}

json machine_report(Device device, int gpu, const std::string& communicator) {
  json j = {{"hostname", host_name()}, {"commit", LAGA_BUILD_COMMIT},
            {"dirty", LAGA_BUILD_DIRTY < 0 ? json(nullptr) : json(LAGA_BUILD_DIRTY == 1)}, {"communicator", communicator},
            {"device", device == Device::Cuda ? "cuda" : "cpu"}};
  if (device == Device::Cuda) {
    j["device_name"] = cuda_device_name(gpu);
    j["device_count"] = cuda_device_count();
    j["device_memory_bytes"] = cuda_mem_info(gpu).total_bytes;
    j["cudnn"] = cudnn_report();
  } else {
    j["device_name"] = "cpu";
  }
  return j;
}

json cudnn_report() { return cudnn_info_report(cuda_cudnn_info()); }

json attention_calls_report(Backend& be) {
  const AttentionProviderCounts c = cuda_attention_provider_counts(be);
  json j = {{"provider", attention_provider_name(cuda_attention_provider(be))},
            {"deterministic", cuda_attention_deterministic(be)},
            {"backward_blocks", cuda_flash_backward_blocks(be)},
            {"laga_forward", c.laga_forward},   {"laga_backward", c.laga_backward},
            {"cudnn_forward", c.cudnn_forward}, {"cudnn_backward", c.cudnn_backward},
            {"fallbacks", c.fallbacks},         {"cudnn_graphs", c.cudnn_graphs}};
  if (!c.last_fallback.empty()) j["last_fallback"] = c.last_fallback;
  return j;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, sep)) out.push_back(cur);
  return out;
}

namespace {

std::string run_capture(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    if (pclose(p) != 0) return "";
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string read_file_field(const char* path, const std::string& key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) {
      auto c = line.find(':');
      if (c == std::string::npos) continue;
      std::string v = line.substr(c + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "";
}

}  // namespace

json machine_inventory() {
  struct utsname u {};
  uname(&u);
  std::string cpu = read_file_field("/proc/cpuinfo", "model name");
  if (cpu.empty()) cpu = read_file_field("/proc/cpuinfo", "Model");  // some ARM kernels
  const std::string mem = read_file_field("/proc/meminfo", "MemTotal");  // "131072 kB"
  double mem_bytes = 0;
  if (!mem.empty()) mem_bytes = std::atof(mem.c_str()) * 1024.0;
  json gpus = json::array();
  const std::string smi = run_capture(
      "nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader,nounits 2>/dev/null");
  for (const std::string& line : split(smi, '\n')) {
    auto f = split(line, ',');
    if (f.size() < 4) continue;
    for (auto& x : f) x.erase(0, x.find_first_not_of(' '));
    gpus.push_back({{"index", std::atoi(f[0].c_str())}, {"name", f[1]},
                    {"memory_bytes", std::atof(f[2].c_str()) * 1024.0 * 1024.0}, {"driver", f[3]}});
  }
  return {{"hostname", host_name()},
          {"os", std::string(u.sysname) + " " + u.release + " " + u.machine},
          {"cpu_model", cpu.empty() ? "unknown" : cpu},
          {"cpu_cores", std::thread::hardware_concurrency()},
          {"memory_bytes", mem_bytes},
          {"gpus", gpus},
          {"cuda_devices", cuda_device_count()}};
}

json build_report() {
  json b = {{"commit", LAGA_BUILD_COMMIT},
            {"commit_from", std::string(LAGA_BUILD_COMMIT) == "unknown" ? "unknown" : "build"},
            {"dirty", LAGA_BUILD_DIRTY < 0 ? json(nullptr) : json(LAGA_BUILD_DIRTY == 1)},
            {"compiler", __VERSION__},
            {"build_type", LAGA_BUILD_TYPE},
#ifdef LAGA_HAVE_CUDA
            {"cuda", true}
#else
            {"cuda", false}
#endif
  };
  return b;
}

}  // namespace laga
