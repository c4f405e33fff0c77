// The block's communicator on GPUs, and ranks as threads of one process.
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "laga/errors.hpp"
#include "laga/measure.hpp"
#include "laga/nccl_comm.hpp"

namespace laga {

const char* gpu_comm_name(GpuComm c) {
  switch (c) {
    case GpuComm::Single: return "single";
    case GpuComm::Nccl: return "nccl";
    case GpuComm::HostStaging: return "host-staging";
  }
  return "?";
}

GpuComm choose_gpu_comm(const std::string& text, int ranks, bool every_rank_own_gpu) {
  LAGA_REQUIRE(text == "auto" || text == "nccl" || text == "host-staging", "comm = '", text,
               "': must be one of auto, nccl, host-staging");
  if (text == "nccl") {
    LAGA_REQUIRE(nccl_available(), "comm = nccl: laga was built without NCCL; use --comm host-staging");
    LAGA_REQUIRE(every_rank_own_gpu, "comm = nccl: ranks share a GPU, and NCCL needs one rank per GPU; use "
                                     "--comm host-staging (or auto), or give each rank its own GPU");
    return GpuComm::Nccl;
  }
  if (text == "host-staging") return GpuComm::HostStaging;
  if (ranks == 1) return GpuComm::Single;
  return every_rank_own_gpu && nccl_available() ? GpuComm::Nccl : GpuComm::HostStaging;
}

std::unique_ptr<Communicator> make_gpu_communicator(GpuComm kind, Communicator& host, Backend& cuda_backend) {
  switch (kind) {
    case GpuComm::Nccl: return make_nccl_communicator(host, cuda_backend);
    case GpuComm::HostStaging: return make_host_staging_communicator(host, cuda_backend);
    case GpuComm::Single: break;
  }
  return make_single_rank_communicator(cuda_backend);
}

void run_thread_ranks(int ranks, const std::function<void(int rank, Communicator& comm)>& fn) {
  auto comms = make_thread_group(ranks);
  // Every thread waits at a gate until all have started: if one cannot start, the others are released to
  // leave without running (none is left waiting in a collective, none is destroyed while joinable).
  std::mutex gate_mutex;
  std::condition_variable gate;
  enum class Start { waiting, go, abandon } start = Start::waiting;
  std::string start_error;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks && start_error.empty(); ++r) {
    try {
      threads.emplace_back([&, r] {
        {
          std::unique_lock<std::mutex> lock(gate_mutex);
          gate.wait(lock, [&] { return start != Start::waiting; });
          if (start == Start::abandon) return;
        }
        try {
          fn(r, *comms[r]);
        } catch (const std::exception& e) {
          // The other threads may wait in a collective forever: end the process. (Not MPI_Abort: where MPI
          // is initialised, it is for the main thread only.)
          std::fprintf(stderr, "laga: failure on rank %d of %d (thread): %s\n", r, ranks, e.what());
          std::fflush(nullptr);
          std::_Exit(dynamic_cast<const InvalidArgument*>(&e) ? 2 : 3);
        }
      });
    } catch (const std::system_error& e) {
      start_error = detail::concat("cannot start thread rank ", r, " of ", ranks, ": ", e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lock(gate_mutex);
    start = start_error.empty() ? Start::go : Start::abandon;
  }
  gate.notify_all();
  for (auto& t : threads) t.join();
  LAGA_CHECK(start_error.empty(), start_error);
}

}  // namespace laga
