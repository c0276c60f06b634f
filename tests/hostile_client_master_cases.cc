// Hostile clients: the cases for the master's gRPC port beyond malformed
// bytes (tests/hostile_client.h): what a client or a node may send that is
// well-formed and still wrong, and a fake node's reconciliation.
#include "tests/hostile_client.h"

namespace hymcache {
namespace hostile {

pb::RegisterNodeRequest FakeNode(const std::string& name) {
  pb::RegisterNodeRequest r;
  r.set_name(name);
  r.set_incarnation(7);
  r.set_data_address("127.0.0.1:1");
  r.set_control_address("127.0.0.1:1");
  pb::RegionInfo* region = r.add_regions();
  region->set_region_id(1);
  // Too small for the health checks' blocks: nothing of theirs lands here.
  // (One caller may hold a quarter of a node in pending puts: 4 KiB.)
  region->set_capacity_bytes(16384);
  region->set_alignment(4096);
  region->set_device_kind("dram");
  return r;
}

std::vector<Case> MasterSemanticCases(Cluster& c) {
  auto stub = [&c]() { return c.master_stub.get(); };
  auto keys_of = [](int n, size_t bytes) {
    std::vector<std::string> k;
    for (int i = 0; i < n; ++i) {
      std::string s = absl::StrCat("hostile-", i, "-");
      s.resize(std::max(bytes, s.size()), 'k');
      k.push_back(s);
    }
    return k;
  };
  auto lookup = [&c](const std::vector<std::string>& keys) {
    pb::BatchLookupRequest r;
    for (const auto& k : keys) r.add_keys(k);
    pb::BatchLookupResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = c.master_stub->BatchLookup(&ctx, r, &resp);
    return std::make_pair(s, resp);
  };
  auto put_start = [&c](const std::vector<std::string>& keys,
                        const std::vector<uint64_t>& lengths,
                        const std::string& parent = "", uint32_t node = 0) {
    pb::PutStartRequest r;
    for (const auto& k : keys) r.add_keys(k);
    for (uint64_t l : lengths) r.add_lengths(l);
    r.set_parent_key(parent);
    r.set_preferred_node_id(node);
    pb::PutStartResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = c.master_stub->PutStart(&ctx, r, &resp);
    return std::make_pair(s, resp);
  };
  auto expect = [](const grpc::Status& s, grpc::StatusCode code) {
    INFO(s.error_message());
    CHECK(s.error_code() == code);
    return FromStatus(s);
  };
  using grpc::StatusCode;
  std::vector<Case> v;
  v.push_back({"lookup_no_keys", [=] {
                 return expect(lookup({}).first, StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back(
      {"lookup_empty_key", [=] {
         return expect(lookup({"a", ""}).first, StatusCode::INVALID_ARGUMENT);
       }});
  v.push_back({"lookup_oversize_key", [=] {
                 return expect(lookup({std::string(257, 'k')}).first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"lookup_100k_keys", [=] {
                 return expect(lookup(keys_of(100000, 16)).first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"lookup_1024_duplicate_keys", [=, &c] {
                 auto [s, r] =
                     lookup(std::vector<std::string>(1024, c.known.keys[0]));
                 CHECK(s.ok());
                 CHECK(r.hit_prefix_length() == 1024);
                 return FromStatus(s);
               }});
  v.push_back({"put_duplicate_keys", [=] {
                 return expect(put_start({"d", "d"}, {4096, 4096}).first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"put_length_0", [=] {
                 return expect(put_start({"z"}, {0}).first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"put_length_2^63", [=] {
                 return expect(put_start({"z"}, {uint64_t{1} << 63}).first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"put_length_2^64-1_twice", [=] {
                 // Lengths whose sum wraps around.
                 return expect(put_start({"y", "z"}, {~uint64_t{0}, 2}).first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"put_lengths_count_mismatch", [=] {
                 return expect(put_start({"y", "z"}, {4096}).first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"put_100k_keys", [=] {
                 std::vector<std::string> k = keys_of(100000, 16);
                 return expect(
                     put_start(k, std::vector<uint64_t>(k.size(), 4096)).first,
                     StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back(
      {"put_oversize_and_empty_keys", [=] {
         Outcome o = expect(put_start({std::string(257, 'k')}, {1}).first,
                            StatusCode::INVALID_ARGUMENT);
         o |= expect(put_start({""}, {1}).first, StatusCode::INVALID_ARGUMENT);
         return o;
       }});
  v.push_back({"put_parent_is_own_key", [=] {
                 return expect(put_start({"p", "q"}, {4096, 4096}, "q").first,
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"put_parent_not_stored", [=] {
                 return expect(put_start({"p"}, {4096}, "never-stored").first,
                               StatusCode::FAILED_PRECONDITION);
               }});
  v.push_back({"put_parent_oversize", [=] {
                 return expect(
                     put_start({"p"}, {4096}, std::string(1 << 20, 'p')).first,
                     StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back({"put_unknown_preferred_node", [=] {
                 return expect(put_start({"p"}, {4096}, "", 0xfffffff0u).first,
                               StatusCode::NOT_FOUND);
               }});
  v.push_back({"put_more_than_the_node_holds", [=] {
                 // 1024 objects of 1 GiB on a 64 MiB node.
                 std::vector<std::string> k = keys_of(1024, 20);
                 auto [s, r] =
                     put_start(k, std::vector<uint64_t>(k.size(), 1 << 30));
                 CHECK(!s.ok());
                 return FromStatus(s);
               }});
  v.push_back({"commit_bogus_put_ids", [=] {
                 Outcome o;
                 for (uint64_t id : {uint64_t{0}, uint64_t{1},
                                     uint64_t{12345678}, ~uint64_t{0}}) {
                   pb::PutCommitRequest r;
                   r.set_put_id(id);
                   r.add_failed_indexes(0);
                   pb::PutCommitResponse resp;
                   grpc::ClientContext ctx;
                   o |= expect(stub()->PutCommit(&ctx, r, &resp),
                               StatusCode::NOT_FOUND);
                 }
                 return o;
               }});
  // Node-confirmed commits (docs/ha.md): a commit of a slot needs the
  // node's receipt for exactly that slot's bytes, else nothing is listed.
  // The puts go to the real node (the fake node of ReconcileCases, alive
  // meanwhile, has no data plane).
  auto commit = [&c](const pb::PutStartResponse& start,
                     const std::vector<std::string>& receipts) {
    pb::PutCommitRequest r;
    r.set_put_id(start.put_id());
    for (const std::string& rc : receipts) r.add_receipts(rc);
    pb::PutCommitResponse resp;
    grpc::ClientContext ctx;
    return c.master_stub->PutCommit(&ctx, r, &resp);
  };
  auto refused_unlisted = [=](const grpc::Status& s,
                              const std::vector<std::string>& keys) {
    INFO(s.error_message());
    CHECK(s.error_code() == StatusCode::PERMISSION_DENIED);
    CHECK(ReasonOfGrpc(s) == StatusReason::kWriteReceiptInvalid);
    auto [ls, found] = lookup(keys);
    REQUIRE(ls.ok());
    for (int i = 0; i < found.results_size(); ++i) {
      CHECK_FALSE(found.results(i).found());
    }
    return FromStatus(s);
  };
  auto gone = [&c](const pb::PutStartResponse& start) {
    // A refused commit ends its put: its space is free again.
    pb::PutAbortRequest a;
    a.set_put_id(start.put_id());
    pb::PutAbortResponse ar;
    grpc::ClientContext ctx;
    CHECK(c.master_stub->PutAbort(&ctx, a, &ar).error_code() ==
          grpc::StatusCode::NOT_FOUND);
  };
  v.push_back({"commit_a_slot_never_written", [=, &c] {
                 auto [s, start] = put_start({"hostile-phantom"}, {4096}, "",
                                             c.info.node_id());
                 REQUIRE(s.ok());
                 REQUIRE(start.put_id() != 0);
                 Outcome o =
                     refused_unlisted(commit(start, {}), {"hostile-phantom"});
                 gone(start);
                 return o;
               }});
  v.push_back(
      {"commit_with_forged_or_empty_receipts", [=, &c] {
         Outcome o;
         for (int variant = 0; variant < 3; ++variant) {
           const std::string key = absl::StrCat("hostile-forged-", variant);
           auto [s, start] = put_start({key}, {4096}, "", c.info.node_id());
           REQUIRE(s.ok());
           REQUIRE(start.put_id() != 0);
           const pb::Location& loc = start.slots(0).location();
           // Exactly the slot's fields, under a key not the node's.
           const std::string forged = master::WriteReceiptFor(
               HmacSha256(std::string(kNodeKeyBytes, 'f')), loc);
           const std::vector<std::string> receipts[] = {
               {forged}, {""}, {std::string(wire::kReceiptBytes, '\0')}};
           o |= refused_unlisted(commit(start, receipts[variant]), {key});
           gone(start);
         }
         return o;
       }});
  v.push_back({"commit_with_another_slots_receipt", [=, &c] {
                 auto [s, start] =
                     put_start({"hostile-rc-a", "hostile-rc-b"}, {4096, 4096},
                               "", c.info.node_id());
                 REQUIRE(s.ok());
                 REQUIRE(start.put_id() != 0);
                 // Slot a is written; b is not, and carries a's receipt.
                 const std::string ra =
                     WriteForReceipt(c.node.data_address, start.slots(0));
                 Outcome o = refused_unlisted(commit(start, {ra, ra}),
                                              {"hostile-rc-a", "hostile-rc-b"});
                 gone(start);
                 return o;
               }});
  v.push_back(
      {"commit_with_an_earlier_generations_receipt", [=, &c] {
         const std::string key = "hostile-old-generation";
         auto [s1, first] = put_start({key}, {4096}, "", c.info.node_id());
         REQUIRE(s1.ok());
         REQUIRE(first.put_id() != 0);
         const std::string old =
             WriteForReceipt(c.node.data_address, first.slots(0));
         {
           pb::PutAbortRequest a;
           a.set_put_id(first.put_id());
           pb::PutAbortResponse ar;
           grpc::ClientContext ctx;
           REQUIRE(c.master_stub->PutAbort(&ctx, a, &ar).ok());
         }
         auto [s2, second] = put_start({key}, {4096}, "", c.info.node_id());
         REQUIRE(s2.ok());
         REQUIRE(second.put_id() != 0);
         REQUIRE(second.slots(0).location().generation() !=
                 first.slots(0).location().generation());
         Outcome o = refused_unlisted(commit(second, {old}), {key});
         gone(second);
         // The same steps with the node's receipt for the slot
         // written: committed and listed.
         auto [s3, third] = put_start({key}, {4096}, "", c.info.node_id());
         REQUIRE(s3.ok());
         REQUIRE(third.put_id() != 0);
         const std::string good =
             WriteForReceipt(c.node.data_address, third.slots(0));
         grpc::Status ok = commit(third, {good});
         INFO(ok.error_message());
         CHECK(ok.ok());
         CHECK(lookup({key}).second.results(0).found());
         return o;
       }});
  v.push_back({"abort_bogus_put_ids", [=] {
                 Outcome o;
                 for (uint64_t id : {uint64_t{0}, ~uint64_t{0}}) {
                   pb::PutAbortRequest r;
                   r.set_put_id(id);
                   pb::PutAbortResponse resp;
                   grpc::ClientContext ctx;
                   o |= expect(stub()->PutAbort(&ctx, r, &resp),
                               StatusCode::NOT_FOUND);
                 }
                 return o;
               }});
  v.push_back(
      {"commit_failed_index_out_of_range_then_twice", [=, &c] {
         auto [s, start] =
             put_start({"hostile-commit-a", "hostile-commit-b"}, {4096, 4096});
         REQUIRE(s.ok());
         REQUIRE(start.put_id() != 0);
         Outcome o;
         for (uint32_t bad : {2u, 1000000u, ~0u}) {
           pb::PutCommitRequest r;
           r.set_put_id(start.put_id());
           r.add_failed_indexes(0);
           r.add_failed_indexes(bad);
           pb::PutCommitResponse resp;
           grpc::ClientContext ctx;
           o |= expect(stub()->PutCommit(&ctx, r, &resp),
                       StatusCode::INVALID_ARGUMENT);
         }
         // Still pending: aborted once, then unknown.
         pb::PutAbortRequest a;
         a.set_put_id(start.put_id());
         pb::PutAbortResponse ar;
         {
           grpc::ClientContext ctx;
           CHECK(stub()->PutAbort(&ctx, a, &ar).ok());
         }
         grpc::ClientContext ctx;
         o |= expect(stub()->PutAbort(&ctx, a, &ar), StatusCode::NOT_FOUND);
         CHECK_FALSE(lookup({"hostile-commit-a"}).second.results(0).found());
         (void)c;
         return o;
       }});
  v.push_back({"remove_no_keys_100k_keys_empty_key", [=] {
                 Outcome o;
                 for (const auto& keys :
                      {std::vector<std::string>{}, keys_of(100000, 8),
                       std::vector<std::string>{""}}) {
                   pb::RemoveRequest r;
                   for (const auto& k : keys) r.add_keys(k);
                   pb::RemoveResponse resp;
                   grpc::ClientContext ctx;
                   o |= expect(stub()->Remove(&ctx, r, &resp),
                               StatusCode::INVALID_ARGUMENT);
                 }
                 return o;
               }});
  v.push_back({"report_missing_other_keys_locations", [=, &c] {
                 // The known block's key with the location of another key,
                 // and unknown keys with the known block's location: no
                 // listing may be dropped.
                 auto [s0, fresh] = lookup({c.known.keys[1]});
                 REQUIRE(fresh.results(0).found());
                 pb::ReportMissingRequest r;
                 r.add_keys(c.known.keys[0]);
                 *r.add_locations() = fresh.results(0).location();
                 r.add_keys("not-a-key");
                 *r.add_locations() = c.known_loc;
                 pb::Location shifted = c.known_loc;
                 shifted.set_generation(shifted.generation() + 1);
                 r.add_keys(c.known.keys[0]);
                 *r.add_locations() = shifted;
                 pb::ReportMissingResponse resp;
                 grpc::ClientContext ctx;
                 grpc::Status s = stub()->ReportMissing(&ctx, r, &resp);
                 REQUIRE(s.ok());
                 for (bool d : resp.dropped()) CHECK_FALSE(d);
                 CHECK(lookup(c.known.keys).second.hit_prefix_length() == 2);
                 return Outcome{};
               }});
  v.push_back({"report_missing_count_mismatch", [=] {
                 pb::ReportMissingRequest r;
                 r.add_keys("a");
                 r.add_keys("b");
                 r.add_locations();
                 pb::ReportMissingResponse resp;
                 grpc::ClientContext ctx;
                 return expect(stub()->ReportMissing(&ctx, r, &resp),
                               StatusCode::INVALID_ARGUMENT);
               }});
  v.push_back(
      {"register_malformed_nodes", [=] {
         Outcome o;
         std::vector<pb::RegisterNodeRequest> bad;
         auto add =
             [&](const std::function<void(pb::RegisterNodeRequest&)>& f) {
               pb::RegisterNodeRequest r = FakeNode("hostile-malformed");
               f(r);
               bad.push_back(r);
             };
         add([](auto& r) { r.set_name(std::string(1 << 20, 'n')); });
         add([](auto& r) { r.set_name(""); });
         add([](auto& r) { r.set_incarnation(0); });
         add([](auto& r) { r.set_data_address("no-port"); });
         add([](auto& r) { r.set_control_address("host:99999999"); });
         add([](auto& r) { r.clear_regions(); });
         add([](auto& r) { r.mutable_regions(0)->set_alignment(3); });
         add([](auto& r) { r.mutable_regions(0)->set_alignment(0); });
         add([](auto& r) { r.mutable_regions(0)->set_capacity_bytes(0); });
         add([](auto& r) { *r.add_regions() = r.regions(0); });
         add([](auto& r) {
           for (int i = 0; i < 100000; ++i) {
             pb::RegionInfo* g = r.add_regions();
             g->set_region_id(i + 2);
             g->set_capacity_bytes(4096);
             g->set_alignment(4096);
           }
         });
         for (const auto& r : bad) {
           pb::RegisterNodeResponse resp;
           grpc::ClientContext ctx;
           o |= expect(stub()->RegisterNode(&ctx, r, &resp),
                       StatusCode::INVALID_ARGUMENT);
         }
         return o;
       }});
  v.push_back(
      {"register_huge_fields", [=] {
         // 4 MiB of transport parameters, 1 MiB addresses: refused
         // by a size cap, or accepted; either way the node record
         // goes again at once (it could not be reached anyway).
         Outcome o;
         std::vector<pb::RegisterNodeRequest> regs;
         regs.push_back(FakeNode("hostile-params"));
         for (int i = 0; i < 4; ++i) {
           (*regs.back().mutable_transport_params())[absl::StrCat("p", i)] =
               std::string(1 << 20, 'x');
         }
         regs.push_back(FakeNode("hostile-address"));
         regs.back().set_data_address(std::string(1 << 20, 'a') + ":1");
         regs.push_back(FakeNode("hostile-control-address"));
         regs.back().set_control_address(std::string(1 << 20, 'a') + ":1");
         for (const auto& r : regs) {
           pb::RegisterNodeResponse resp;
           grpc::ClientContext ctx;
           grpc::Status s = stub()->RegisterNode(&ctx, r, &resp);
           o |= FromStatus(s);
           if (!s.ok()) {
             CHECK(s.error_code() == StatusCode::INVALID_ARGUMENT);
             continue;
           }
           pb::DeregisterNodeRequest d;
           d.set_node_id(resp.node_id());
           d.set_incarnation(r.incarnation());
           *d.mutable_auth() = Auth(resp.node_key(), "deregister", r.name(),
                                    resp.node_id(), r.incarnation());
           pb::DeregisterNodeResponse dr;
           grpc::ClientContext dctx;
           CHECK(stub()->DeregisterNode(&dctx, d, &dr).ok());
         }
         // ListNodes (hymctl status) still answers.
         pb::ListNodesResponse ln;
         grpc::ClientContext lctx;
         CHECK(stub()->ListNodes(&lctx, {}, &ln).ok());
         return o;
       }});
  v.push_back(
      {"heartbeat_unknown_and_wrong_incarnation", [=, &c] {
         Outcome o;
         for (auto [id, inc] :
              {std::make_pair(0xfffffff0u, uint64_t{1}),
               std::make_pair(c.info.node_id(), c.info.incarnation() + 1)}) {
           pb::HeartbeatRequest r;
           r.set_node_id(id);
           r.set_incarnation(inc);
           pb::HeartbeatResponse resp;
           grpc::ClientContext ctx;
           REQUIRE(stub()->Heartbeat(&ctx, r, &resp).ok());
           CHECK(resp.reregister());
           o.error = true;  // told to register
         }
         return o;
       }});
  v.push_back({"deregister_unknown_and_wrong_incarnation", [=, &c] {
                 Outcome o;
                 pb::DeregisterNodeRequest r;
                 pb::DeregisterNodeResponse resp;
                 r.set_node_id(0xfffffff0u);
                 {
                   grpc::ClientContext ctx;
                   o |= expect(stub()->DeregisterNode(&ctx, r, &resp),
                               StatusCode::NOT_FOUND);
                 }
                 // The real node's id without its node key.
                 r.set_node_id(c.info.node_id());
                 r.set_incarnation(c.info.incarnation() + 1);
                 grpc::ClientContext ctx;
                 o |= expect(stub()->DeregisterNode(&ctx, r, &resp),
                             StatusCode::PERMISSION_DENIED);
                 return o;
               }});
  v.push_back({"begin_reconcile_unknown_and_wrong_incarnation", [=, &c] {
                 Outcome o;
                 pb::BeginReconcileRequest r;
                 pb::BeginReconcileResponse resp;
                 r.set_node_id(0xfffffff0u);
                 {
                   grpc::ClientContext ctx;
                   o |= expect(stub()->BeginReconcile(&ctx, r, &resp),
                               StatusCode::NOT_FOUND);
                 }
                 r.set_node_id(c.info.node_id());
                 r.set_incarnation(c.info.incarnation() + 1);
                 grpc::ClientContext ctx;
                 o |= expect(stub()->BeginReconcile(&ctx, r, &resp),
                             StatusCode::PERMISSION_DENIED);
                 return o;
               }});
  v.push_back(
      {"list_objects_page_sizes", [=] {
         Outcome o;
         for (uint32_t page : {0u, 1u, 65536u, 65537u, 0x7fffffffu, ~0u}) {
           for (uint32_t node : {0u, 0xfffffff0u}) {
             pb::ListObjectsRequest r;
             r.set_page_size(page);
             r.set_node_id(node);
             grpc::ClientContext ctx;
             auto reader = stub()->ListObjects(&ctx, r);
             pb::ListObjectsResponse resp;
             size_t objects = 0;
             while (reader->Read(&resp)) {
               CHECK(resp.objects_size() > 0);
               if (page != 0)
                 CHECK(resp.objects_size() <= int(std::min(page, 65536u)));
               objects += resp.objects_size();
             }
             grpc::Status s = reader->Finish();
             CHECK(s.ok());
             if (node == 0) CHECK(objects >= 2);
             if (node != 0) CHECK(objects == 0);
           }
         }
         return o;
       }});
  v.push_back(
      {"list_objects_cancelled", [=, &c] {
         Outcome o;
         for (int i = 0; i < 20; ++i) {
           pb::ListObjectsRequest r;
           r.set_page_size(1);
           o |= FromStatus(
               RawCall(c.master_ch, "/hymcache.v1.MasterService/ListObjects",
                       {Ser(r)}, RawCallOptions{absl::Seconds(15), true})
                   .status);
         }
         return o;
       }});
  return v;
}

// Reconciliation cases against a node record of the test's own (so the
// real node's reconciliation is never superseded): a fake node with one
// committed 4 KiB listing, which no reconciliation stream that the node did
// not complete may drop.

std::vector<Case> ReconcileCases(Cluster& c, FakeReconcile& f) {
  using grpc::StatusCode;
  auto expect = [&f](const grpc::Status& s,
                     std::initializer_list<StatusCode> codes) {
    INFO(s.error_code() << ": " << s.error_message());
    bool any = false;
    for (StatusCode code : codes) any |= s.error_code() == code;
    CHECK(any);
    CHECK(f.Listed());
    return FromStatus(s);
  };
  auto extent = [](uint32_t region, uint64_t addr, uint64_t len, uint64_t gen) {
    pb::Location l;
    l.set_region_id(region);
    l.set_addr(addr);
    l.set_length(len);
    l.set_generation(gen);
    return l;
  };
  std::vector<Case> v;
  v.push_back(
      {"commit_with_another_nodes_receipt", [&, expect] {
         // A slot on the real node, "confirmed" by a receipt that
         // the fake node (whose key this client holds) signs for
         // its fields (under the real node's id, then its own):
         // not the placed node's.
         Outcome o;
         for (int variant = 0; variant < 2; ++variant) {
           const std::string key = absl::StrCat("hostile-other-node-", variant);
           pb::PutStartRequest ps;
           ps.add_keys(key);
           ps.add_lengths(4096);
           ps.set_preferred_node_id(c.info.node_id());
           pb::PutStartResponse start;
           {
             grpc::ClientContext ctx;
             REQUIRE(c.master_stub->PutStart(&ctx, ps, &start).ok());
           }
           REQUIRE(start.put_id() != 0);
           REQUIRE(start.node().node_id() == c.info.node_id());
           pb::Location loc = start.slots(0).location();
           if (variant == 1) loc.set_node_id(f.id);
           pb::PutCommitRequest r;
           r.set_put_id(start.put_id());
           r.add_receipts(master::WriteReceiptFor(HmacSha256(f.key), loc));
           pb::PutCommitResponse resp;
           grpc::ClientContext ctx;
           grpc::Status s = c.master_stub->PutCommit(&ctx, r, &resp);
           o |= expect(s, {StatusCode::PERMISSION_DENIED});
           CHECK(ReasonOfGrpc(s) == StatusReason::kWriteReceiptInvalid);
           pb::BatchLookupRequest lr;
           lr.add_keys(key);
           pb::BatchLookupResponse lookup;
           grpc::ClientContext lctx;
           REQUIRE(c.master_stub->BatchLookup(&lctx, lr, &lookup).ok());
           CHECK_FALSE(lookup.results(0).found());
         }
         return o;
       }});
  v.push_back({"reconcile_empty_stream", [&, expect] {
                 return expect(f.Stream({}), {StatusCode::INVALID_ARGUMENT});
               }});
  v.push_back({"reconcile_wrong_epoch", [&, expect] {
                 const uint64_t epoch = f.Begin();
                 Outcome o = expect(f.Stream({Ser(f.First(epoch + 1))}),
                                    {StatusCode::ABORTED});
                 o |=
                     expect(f.Stream({Ser(f.First(0))}), {StatusCode::ABORTED});
                 return o;
               }});
  v.push_back({"reconcile_unknown_node_and_incarnation", [&, expect] {
                 pb::ReconcileNodeRequest r = f.First(f.Begin());
                 r.set_incarnation(r.incarnation() + 1);
                 // (Its proof names the registered incarnation.)
                 Outcome o = expect(f.Stream({Ser(r)}),
                                    {StatusCode::FAILED_PRECONDITION,
                                     StatusCode::PERMISSION_DENIED});
                 r.set_node_id(0xfffffff0u);
                 o |= expect(f.Stream({Ser(r)}), {StatusCode::NOT_FOUND});
                 return o;
               }});
  v.push_back(
      {"reconcile_absurd_extents", [&, expect, extent] {
         Outcome o;
         for (const pb::Location& bad :
              {extent(1, 0, 0, 5), extent(1, 0, 4096, 0)}) {
           pb::ReconcileNodeRequest r = f.First(f.Begin());
           *r.add_extents() = f.loc;
           *r.add_extents() = bad;
           o |= expect(f.Stream({Ser(r)}), {StatusCode::INVALID_ARGUMENT});
         }
         // A generation twice.
         pb::ReconcileNodeRequest r = f.First(f.Begin());
         *r.add_extents() = f.loc;
         *r.add_extents() = f.loc;
         o |= expect(f.Stream({Ser(r)}), {StatusCode::INVALID_ARGUMENT});
         return o;
       }});
  v.push_back(
      {"reconcile_chunk_over_limit", [&, expect, extent] {
         pb::ReconcileNodeRequest r = f.First(f.Begin());
         *r.add_extents() = f.loc;
         for (uint64_t i = 0; i < 65536; ++i) {
           *r.add_extents() = extent(1, i << 12, 4096, (uint64_t{1} << 40) + i);
         }
         return expect(f.Stream({Ser(r)}), {StatusCode::INVALID_ARGUMENT});
       }});
  v.push_back(
      {"reconcile_unsorted_and_huge_extents", [&, extent] {
         // Accepted (the master compares by generation): what it
         // does not list is handed back as unlisted.
         pb::ReconcileNodeRequest r = f.First(f.Begin());
         *r.add_extents() =
             extent(9, ~uint64_t{0} - 10, ~uint64_t{0}, ~uint64_t{0});
         *r.add_extents() = extent(1, uint64_t{1} << 63, uint64_t{1} << 63, 3);
         *r.add_extents() = f.loc;
         *r.add_extents() = extent(0, 0, 1, 2);
         r.set_last(true);
         RawCallResult res = RawCall(
             c.master_ch, "/hymcache.v1.MasterService/ReconcileNode", {Ser(r)});
         INFO(res.status.error_message());
         CHECK(res.status.ok());
         REQUIRE(res.messages.size() == 1);
         pb::ReconcileNodeResponse resp;
         REQUIRE(resp.ParseFromString(res.messages[0]));
         CHECK(resp.matched() == 1);
         CHECK(resp.unlisted_count() == 3);
         CHECK(f.Listed());
         return Outcome{};
       }});
  v.push_back({"reconcile_message_after_last", [&, expect] {
                 pb::ReconcileNodeRequest r = f.First(f.Begin());
                 *r.add_extents() = f.loc;
                 r.set_last(true);
                 pb::ReconcileNodeRequest more;
                 return expect(f.Stream({Ser(r), Ser(more)}),
                               {StatusCode::INVALID_ARGUMENT});
               }});
  v.push_back({"reconcile_ends_without_last", [&, expect] {
                 // Half-closed after a first message that is not the last.
                 return expect(f.Stream({Ser(f.First(f.Begin()))}),
                               {StatusCode::ABORTED});
               }});
  v.push_back({"reconcile_garbage_after_first_message", [&, expect] {
                 // The node's first message, then bytes no parser accepts:
                 // the stream is broken, not complete; nothing is judged.
                 const std::string garbage("\x0a\xff\xff\xff\xff\x0f", 6);
                 return expect(
                     f.Stream({Ser(f.First(f.Begin())), garbage}),
                     {StatusCode::INTERNAL, StatusCode::INVALID_ARGUMENT,
                      StatusCode::ABORTED, StatusCode::CANCELLED});
               }});
  v.push_back({"reconcile_cancelled_mid_stream", [&, expect] {
                 RawCallOptions o;
                 o.cancel = true;
                 o.before_cancel = absl::Milliseconds(200);
                 return expect(f.Stream({Ser(f.First(f.Begin()))}, o),
                               {StatusCode::CANCELLED});
               }});
  v.push_back({"reconcile_deadline_mid_stream", [&, expect] {
                 RawCallOptions o;
                 o.cancel = true;  // never half-closes: the deadline ends it
                 o.before_cancel = absl::Milliseconds(600);
                 o.timeout = absl::Milliseconds(300);
                 return expect(
                     f.Stream({Ser(f.First(f.Begin()))}, o),
                     {StatusCode::DEADLINE_EXCEEDED, StatusCode::CANCELLED});
               }});
  return v;
}
}  // namespace hostile
}  // namespace hymcache
