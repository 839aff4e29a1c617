// Which ranks of a group share a host: the map the hierarchical collectives follow. Every rank
// builds it from the same list (each rank's host, agreed through the group's store), so every rank
// holds the same layout.
#pragma once

#include <string>
#include <vector>

namespace ringreduce {

class HostLayout {
 public:
  // `host_of_rank[r]` is any label of rank r's host; equal labels mean one host. Hosts are numbered
  // by their lowest rank, and a host's ranks are taken in rank order, so the layout does not depend
  // on the labels or on how ranks were placed (contiguous or round-robin).
  explicit HostLayout(const std::vector<int>& host_of_rank);

  int world() const { return static_cast<int>(host_of_.size()); }
  int hosts() const { return static_cast<int>(ranks_.size()); }
  // Host h's ranks, ascending.
  const std::vector<int>& ranks_of(int host) const { return ranks_[host]; }
  int host_of(int rank) const { return host_of_[rank]; }
  // Rank r's place among its host's ranks.
  int local_of(int rank) const { return local_of_[rank]; }
  // The most ranks any host has: the number of shards a hierarchical collective cuts the buffer into.
  int widest() const { return widest_; }
  // Whether a hierarchical collective can move fewer bytes across hosts than a flat one: several
  // hosts, and at least one with several ranks.
  bool has_hierarchy() const { return hosts() > 1 && widest_ > 1; }
  // Which rank of `host` carries shard `shard` across hosts (ranks of a smaller host take several).
  int shard_owner(int host, int shard) const;
  // The shards (columns) rank r carries across hosts, ascending: those shard_owner gives it.
  std::vector<int> shards_of(int rank) const;
  // Whether every host has the same number of ranks.
  bool even() const;
  // A reduce-scatter or all-gather laid out by column: a column per rank of the widest host, a chunk
  // per host in each, so widest() x hosts() chunks. Rank r's chunk sits in column local_of(r) at
  // host_of(r); where a host has fewer ranks, its chunks in the columns past them belong to no rank,
  // and the host's rank that carries that column across hosts (shard_owner) carries them too.
  int column_slots() const { return widest_ * hosts(); }
  int column_position(int rank) const { return local_of_[rank] * hosts() + host_of_[rank]; }
  // Whether the hierarchical reduce-scatter and all-gather move fewer bytes across hosts than the
  // flat ring: each column's ring crosses each host's link with hosts() - 1 chunks, widest() x
  // (hosts() - 1) in all, against the world() - 1 of the flat ring where it crosses. So where every
  // host has the same number (2 or more) of ranks, and where they differ by little (3+2, 4+4+3; not
  // 2+1+2, whose links carry 4 chunks either way, nor any layout with a host of one rank).
  bool chunked_hierarchy_pays() const;
  // "2 hosts x 2 ranks", or "3 hosts (2+1+2 ranks)" when they differ.
  std::string describe() const;

 private:
  std::vector<std::vector<int>> ranks_;
  std::vector<int> host_of_;
  std::vector<int> local_of_;
  int widest_ = 0;
};

}  // namespace ringreduce
