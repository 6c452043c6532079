// Scenario 1: two clients, one of them a separate process, share a prompt prefix through
// the daemon's prefix cache and read the shared blocks in place.
#include <map>

#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

using ::testing::ElementsAreArray;

std::vector<uint32_t> ParseIds(const std::string& csv) {
  std::vector<uint32_t> out;
  if (csv == "-") return out;
  size_t pos = 0;
  while (pos < csv.size()) {
    const size_t comma = csv.find(',', pos);
    out.push_back(static_cast<uint32_t>(std::stoul(csv.substr(pos, comma - pos))));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

class PrefixSharingTest : public IntegrationTest {};

TEST_F(PrefixSharingTest, SecondProcessAdoptsTheCachedPrefixAndReadsIdenticalBlocks) {
  Daemon* d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(a, Open(*client, "team-a", /*max_sequences=*/2));

  // Client A: a 266-token prompt, nothing cached yet; appending it seals the fp16 sink tile
  // and three quantized tiles and leaves 10 tokens in the tail.
  constexpr uint32_t kFirst = 10000;
  constexpr size_t kLen = 4 * kTile + 10;
  const std::vector<uint32_t> prompt = Tokens(kFirst, kLen);
  IT_ASSIGN_OR_FAIL(seq_a, a->CreateSequence(prompt));
  EXPECT_EQ(seq_a.cached_tokens, 0u);
  IT_ASSIGN_OR_FAIL(table_a, AppendTokens(*a, seq_a.id, prompt, 0, kLen));
  ASSERT_EQ(table_a.tokens, kLen);
  ASSERT_TRUE(table_a.has_sink);
  ASSERT_EQ(table_a.quant_blocks.size(), 3u);
  ASSERT_EQ(table_a.tail_tokens, 10u);

  // Client B, another process, same tenant and prompt: it adopts floor((266 - 1) / 64) = 4
  // tiles (sink + 3 quantized) = 256 tokens, the very same blocks, and appends the other 10.
  Child* b = SpawnClient({"share", "--target=" + d->target(), "--tenant=team-a", absl::StrCat("--first=", kFirst),
                          absl::StrCat("--len=", kLen), "--append", "--max_sequences=2"});
  ASSERT_NE(b, nullptr);
  IT_ASSIGN_OR_FAIL(created, b->WaitFor("CREATED", std::chrono::seconds(20)));
  auto f = ParseFields(created);
  EXPECT_EQ(FieldU64(f, "cached"), 4u * kTile);
  EXPECT_EQ(FieldU64(f, "tokens"), 4u * kTile);
  EXPECT_EQ(FieldU64(f, "has_sink"), 1u);
  EXPECT_EQ(FieldU64(f, "sink"), table_a.sink_block);
  EXPECT_THAT(ParseIds(f["quant"]), ElementsAreArray(table_a.quant_blocks));
  EXPECT_EQ(FieldU64(f, "tail_tokens"), 0u);
  IT_ASSIGN_OR_FAIL(appended, b->WaitFor("APPENDED", std::chrono::seconds(20)));
  f = ParseFields(appended);
  EXPECT_EQ(FieldU64(f, "tokens"), kLen);
  EXPECT_EQ(FieldU64(f, "tail_tokens"), 10u);
  EXPECT_THAT(ParseIds(f["quant"]), ElementsAreArray(table_a.quant_blocks));

  // Both processes read the shared blocks in place: identical raw bytes and identical
  // dequantized K/V.
  IT_ASSIGN_OR_FAIL(sink_line, b->WaitFor("SINK", std::chrono::seconds(20)));
  EXPECT_EQ(ParseFields(sink_line)["raw"], Hex64(DigestSinkBlock(*a, table_a.sink_block)));
  for (size_t i = 0; i < table_a.quant_blocks.size(); ++i) {
    IT_ASSIGN_OR_FAIL(line, b->WaitFor("QUANT", std::chrono::seconds(20)));
    f = ParseFields(line);
    IT_ASSIGN_OR_FAIL(mine, DigestQuantBlock(*a, table_a.quant_blocks[i]));
    EXPECT_EQ(FieldU64(f, "id"), table_a.quant_blocks[i]);
    EXPECT_EQ(f["raw"], Hex64(mine.raw)) << "raw bytes of block " << table_a.quant_blocks[i] << " differ";
    EXPECT_EQ(f["deq"], Hex64(mine.dequantized)) << "dequantized block " << table_a.quant_blocks[i] << " differs";
  }
  IT_ASSIGN_OR_FAIL(ready, b->WaitFor("READY", std::chrono::seconds(20)));

  // While both hold the prefix, each shared block is one active block, not two.
  IT_ASSIGN_OR_FAIL(stats, a->Stats());
  EXPECT_EQ(stats.quant_blocks_active(), 3u);
  EXPECT_EQ(stats.sink_blocks_active(), 1u);
  EXPECT_EQ(stats.sessions(), 2u);
  EXPECT_EQ(stats.sequences(), 2u);
  EXPECT_EQ(stats.seals(), 4u) << "B's identical tiles must not be sealed again";
  EXPECT_EQ(stats.prefix_hit_tokens(), 256u);

  // The len-1 rule, prompt by prompt (a third session, in this process): at most
  // floor((len - 1) / 64) tiles are adopted, so the last prompt token is always computed.
  IT_ASSIGN_OR_FAIL(c, Open(*client, "team-a", 2));
  const std::vector<std::pair<size_t, uint64_t>> cases = {
      {1, 0}, {64, 0}, {65, 64}, {128, 64}, {129, 128}, {192, 128}, {256, 192}, {257, 256}, {266, 256}};
  uint64_t hits = 256, queried = kLen * 2;
  for (const auto& [len, want] : cases) {
    const std::span<const uint32_t> p(prompt.data(), len);
    IT_ASSIGN_OR_FAIL(lookup, c->Lookup(p));
    EXPECT_EQ(lookup, want) << "Lookup of a " << len << "-token prompt";
    IT_ASSIGN_OR_FAIL(s, c->CreateSequence(p));
    EXPECT_EQ(s.cached_tokens, want) << "CreateSequence of a " << len << "-token prompt";
    EXPECT_EQ(s.table.tokens, want);
    EXPECT_EQ(s.table.quant_blocks.size(), want >= 128 ? want / kTile - 1 : 0);
    const uint64_t ids[] = {s.id};
    IT_ASSERT_OK(c->Release(ids));
    hits += want;
    queried += len;
  }
  // A prompt that continues past the cached tiles adopts all four, then stops.
  std::vector<uint32_t> longer = prompt;
  for (uint32_t t : Tokens(90000, 200)) longer.push_back(t);
  IT_ASSIGN_OR_FAIL(lookup_longer, c->Lookup(longer));
  EXPECT_EQ(lookup_longer, 256u);
  // Another tenant gets nothing from team-a's cache.
  IT_ASSIGN_OR_FAIL(other, Open(*client, "team-b", 2));
  IT_ASSIGN_OR_FAIL(other_lookup, other->Lookup(prompt));
  EXPECT_EQ(other_lookup, 0u);

  IT_ASSIGN_OR_FAIL(after, a->Stats());
  EXPECT_EQ(after.prefix_hit_tokens(), hits);
  EXPECT_EQ(after.prefix_queried_tokens(), queried);
  Report(absl::StrCat("prefix sharing: hit tokens ", after.prefix_hit_tokens(), " of ", after.prefix_queried_tokens(),
                      " queried; seals ", after.seals()));

  // B exits cleanly (closing its session) once its stdin closes.
  b->CloseStdin();
  IT_ASSIGN_OR_FAIL(status, b->Wait(std::chrono::seconds(10)));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << b->transcript();
  IT_ASSIGN_OR_FAIL(final_stats, a->Stats());
  EXPECT_EQ(final_stats.sessions(), 3u);  // a, c, other
  EXPECT_EQ(final_stats.sequences(), 1u);
  EXPECT_EQ(final_stats.quant_blocks_active(), 3u);  // still held by A
}

}  // namespace
}  // namespace kvarn::it
