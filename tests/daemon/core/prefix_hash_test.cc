// The vectors of docs/prefix_hash.md, computed independently with Python's hashlib.
#include "common/prefix_hash.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace kvarn {
namespace {

HashNamespaceInput Llama(const BlockHash& salt) {
  HashNamespaceInput in;
  in.model_id = "llama-3-8b";
  in.num_layers = 32;
  in.num_kv_heads = 8;
  in.head_dim = 128;
  in.tile_tokens = 128;
  in.preset = "kvarn_k4v2_g128";
  in.sink_tokens = 128;
  in.tenant_salt = salt;
  return in;
}

std::vector<uint32_t> Range(uint32_t first, uint32_t n) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(PrefixHashTest, MatchesDocumentedVectors) {
  const BlockHash salt = TenantSalt("alice", "");
  EXPECT_EQ(HashToHex(salt), "8c2c93d4bf3161b727a87a1025638aba1d39576520afe4cf0d08da86a562dcaf");
  const BlockHash ns = NamespaceDigest(Llama(salt));
  EXPECT_EQ(HashToHex(ns), "e9e76cc1c2970d8874b872a81518259ee6904c684028613e57797250b2c466aa");
  const BlockHash h0 = ChainHash(kRootHash, ns, Range(0, 128));
  EXPECT_EQ(HashToHex(h0), "ab8d3747a6f96f03478cb686ef69eadcc65d8dac0e6bf0fd5ec269a06b6cec1a");
  const BlockHash h1 = ChainHash(h0, ns, Range(128, 128));
  EXPECT_EQ(HashToHex(h1), "e1c087e05c16415e1bbf06a4d746c181bb54011c936f3837f249abe5c8b9ead1");
  const BlockHash bob = TenantSalt("bob", "s3cret");
  EXPECT_EQ(HashToHex(bob), "3bca1e91b8688b502a3ea23c884571e237b85392715a5edde4d31c856d85d604");
  EXPECT_EQ(HashToHex(ChainHash(kRootHash, NamespaceDigest(Llama(bob)), Range(0, 128))),
            "c6eb22e7c6d53a5535a94c7b4b042e60c1e9338a1c6fe43b98b331c8f7e9bd33");
}

TEST(PrefixHashTest, EveryNamespaceFieldChangesTheHash) {
  const HashNamespaceInput base = Llama(TenantSalt("alice", ""));
  const BlockHash ref = NamespaceDigest(base);
  std::vector<HashNamespaceInput> variants(8, base);
  variants[0].model_id = "llama-3-8c";
  variants[1].num_layers = 31;
  variants[2].num_kv_heads = 4;
  variants[3].head_dim = 64;
  variants[4].tile_tokens = 64;
  variants[5].preset = "kvarn_k4v4_g128";
  variants[6].sink_tokens = 0;
  variants[7].tenant_salt = TenantSalt("alicf", "");
  for (const auto& v : variants) EXPECT_NE(NamespaceDigest(v), ref);
}

TEST(PrefixHashTest, ChainDependsOnParentAndEveryToken) {
  const BlockHash ns = NamespaceDigest(Llama(TenantSalt("a", "")));
  std::vector<uint32_t> t = Range(0, 128);
  const BlockHash h = ChainHash(kRootHash, ns, t);
  t[127] = 1000;
  EXPECT_NE(ChainHash(kRootHash, ns, t), h);
  t[127] = 127;
  EXPECT_EQ(ChainHash(kRootHash, ns, t), h);
  EXPECT_NE(ChainHash(h, ns, t), h);
}

}  // namespace
}  // namespace kvarn
