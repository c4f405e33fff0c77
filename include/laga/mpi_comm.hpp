// MPI communicator for CPU ranks. The only header of the library that talks about MPI; it does not
// include mpi.h, so callers need not either.
#pragma once

#include <memory>

#include "laga/comm.hpp"

namespace laga {

// Initialises MPI on construction (if not yet) and finalises it on destruction (if it initialised it).
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int rank() const;
  int size() const;
  // Ends every rank at once (used when one rank fails after the others may have entered a collective).
  [[noreturn]] static void abort(int code);

 private:
  bool owns_ = false;
};

// Communicator over MPI_COMM_WORLD (a duplicate of it), for host buffers.
std::unique_ptr<Communicator> make_mpi_communicator();

// The same predicate on every rank: true iff `ok` is true on all ranks (an MPI_Allreduce of a flag).
bool mpi_all_ok(bool ok);

// This process among the ranks of MPI_COMM_WORLD on the same node (MPI_Comm_split_type shared memory):
// how ranks pick a GPU (local_rank % device count) and learn whether they share one.
struct MpiNodeInfo {
  int local_rank = 0;
  int local_size = 1;
};
MpiNodeInfo mpi_node_info();

}  // namespace laga
