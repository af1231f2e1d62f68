// send/recv of ShmComm: one ring per ordered pair (sender, receiver) in the segment, messages
// framed by a (tag, bytes) header and streamed through the ring when larger than it. The
// receiver matches by tag: a message for another tag is read into a private per-(peer, tag)
// queue, so messages match FIFO per (sender, receiver, tag). Sends and recvs of different tags
// may run on different threads at once (shm_comm_impl.h: send_mu_, recv_mu_). The collectives
// are in shm_comm.cpp.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "segment.h"
#include "shm_comm_impl.h"

namespace openneuron::collectives {
namespace {

struct MessageHeader {
  int64_t tag;
  uint64_t bytes;
};

constexpr const char* kP2pHint =
    "did not make the matching call; check that every send has a matching recv with the same "
    "peers, tag and size";

void ring_write(uint8_t* ring, size_t cap, uint64_t pos, const void* src, size_t n) {
  const size_t at = static_cast<size_t>(pos % cap), first = std::min(n, cap - at);
  std::memcpy(ring + at, src, first);
  std::memcpy(ring, static_cast<const uint8_t*>(src) + first, n - first);
}

void ring_read(const uint8_t* ring, size_t cap, uint64_t pos, void* dst, size_t n) {
  const size_t at = static_cast<size_t>(pos % cap), first = std::min(n, cap - at);
  std::memcpy(dst, ring + at, first);
  std::memcpy(static_cast<uint8_t*>(dst) + first, ring, n - first);
}

std::string describe(const char* op, size_t bytes, const char* dir, int peer, int tag) {
  return std::string(op) + "(" + std::to_string(bytes) + " bytes, tag " + std::to_string(tag) +
         ") " + dir + " rank " + std::to_string(peer);
}

}  // namespace

shm::Channel& ShmCommImpl::channel(int from, int to) const {
  const size_t i = static_cast<size_t>(from) * size_ + to;
  return *reinterpret_cast<shm::Channel*>(base_ + layout_.channels + i * layout_.channel_stride);
}

uint8_t* ShmCommImpl::channel_data(int from, int to) const {
  return reinterpret_cast<uint8_t*>(&channel(from, to)) + sizeof(shm::Channel);
}

void ShmCommImpl::check_peer(const char* op, int peer, int tag) const {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw CommError(prefix(std::string(op) + " (tag " + std::to_string(tag) + ")") + ": peer " +
                    std::to_string(peer) + " must be another rank of the group (0.." +
                    std::to_string(size_ - 1) + ", not " + std::to_string(rank_) + ")");
  }
}

void ShmCommImpl::send(const void* buf, size_t bytes, int peer, int tag) {
  check_peer("send", peer, tag);
  auto what = [&] { return describe("send", bytes, "to", peer, tag); };
  check_usable(what());
  std::lock_guard<std::mutex> lock(send_mu_[peer]);
  shm::Channel& ch = channel(rank_, peer);
  uint8_t* ring = channel_data(rank_, peer);
  const size_t cap = layout_.channel_bytes;
  uint64_t head = ch.head.load(std::memory_order_relaxed);
  auto space = [&] { return cap - (head - ch.tail.load(std::memory_order_seq_cst)); };
  auto blame = [&] { return std::vector<int>{peer}; };
  const MessageHeader header{tag, bytes};
  wait_until(
      ch.futex, [&] { return space() >= sizeof(header); }, blame, what, kP2pHint);
  ring_write(ring, cap, head, &header, sizeof(header));
  head += sizeof(header);
  const auto* src = static_cast<const uint8_t*>(buf);
  size_t done = 0;
  for (;;) {
    const size_t n = std::min(space(), bytes - done);
    ring_write(ring, cap, head, src + done, n);
    head += n;
    done += n;
    ch.head.store(head, std::memory_order_seq_cst);
    shm::futex_wake_all(ch.futex);
    if (done == bytes) return;
    // NOTE: waits for a quarter of the ring (or the rest) so a stream moves in large copies;
    // the receiver's wait is the mirror image, so the two never wait on each other.
    const size_t want = std::min(cap / 4, bytes - done);
    wait_until(
        ch.futex, [&] { return space() >= want; }, blame, what, kP2pHint);
  }
}

void ShmCommImpl::channel_read(int peer, uint64_t& tail, uint8_t* dst, size_t n,
                               const std::string& what) {
  shm::Channel& ch = channel(peer, rank_);
  const uint8_t* ring = channel_data(peer, rank_);
  const size_t cap = layout_.channel_bytes;
  auto avail = [&] { return ch.head.load(std::memory_order_seq_cst) - tail; };
  size_t done = 0;
  while (done < n) {
    const size_t want = std::min(cap / 4, n - done);
    wait_until(
        ch.futex, [&] { return avail() >= want; }, [&] { return std::vector<int>{peer}; },
        [&] { return what; }, kP2pHint);
    const size_t k = std::min<size_t>(avail(), n - done);
    ring_read(ring, cap, tail, dst + done, k);
    tail += k;
    done += k;
    ch.tail.store(tail, std::memory_order_seq_cst);
    shm::futex_wake_all(ch.futex);
  }
}

void ShmCommImpl::recv(void* buf, size_t bytes, int peer, int tag) {
  check_peer("recv", peer, tag);
  const std::string what = describe("recv", bytes, "from", peer, tag);
  check_usable(what);
  auto size_mismatch = [&](uint64_t sent) {
    fail(prefix(what) + ": rank " + std::to_string(peer) + " sent " + std::to_string(sent) +
         " bytes with tag " + std::to_string(tag) + " but this rank expects " +
         std::to_string(bytes) + "; a send and its matching recv must have the same size");
  };
  shm::Channel& ch = channel(peer, rank_);
  auto& queued = pending_[peer];
  for (;;) {
    const uint64_t seen = queued_[peer].load(std::memory_order_seq_cst);
    {
      std::lock_guard<std::mutex> lock(recv_mu_[peer]);
      if (auto it = queued.find(tag); it != queued.end() && !it->second.empty()) {
        std::vector<uint8_t> message = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) queued.erase(it);
        if (message.size() != bytes) size_mismatch(message.size());
        if (bytes != 0) std::memcpy(buf, message.data(), bytes);
        return;
      }
      uint64_t tail = ch.tail.load(std::memory_order_relaxed);
      // NOTE: a header is read only once it is all there, so no thread waits under the lock
      // for a message that has not started (the one it waits on is streaming, or fails).
      while (ch.head.load(std::memory_order_seq_cst) - tail >= sizeof(MessageHeader)) {
        MessageHeader header;
        channel_read(peer, tail, reinterpret_cast<uint8_t*>(&header), sizeof(header), what);
        if (header.tag == tag) {
          if (header.bytes != bytes) size_mismatch(header.bytes);
          channel_read(peer, tail, static_cast<uint8_t*>(buf), bytes, what);
          return;
        }
        // NOTE: a message for another tag is drained into this rank's memory so that the
        // sender (which may be streaming it) is never blocked behind a recv for a later one.
        std::vector<uint8_t> message(header.bytes);
        channel_read(peer, tail, message.data(), message.size(), what);
        queued[static_cast<int>(header.tag)].push_back(std::move(message));
        queued_[peer].fetch_add(1, std::memory_order_seq_cst);
        shm::futex_wake_all(ch.futex);  // a recv of that tag may be waiting below
      }
    }
    wait_until(
        ch.futex,
        [&] {
          return ch.head.load(std::memory_order_seq_cst) -
                         ch.tail.load(std::memory_order_seq_cst) >=
                     sizeof(MessageHeader) ||
                 queued_[peer].load(std::memory_order_seq_cst) != seen;
        },
        [&] { return std::vector<int>{peer}; }, [&] { return what; }, kP2pHint);
  }
}

}  // namespace openneuron::collectives
