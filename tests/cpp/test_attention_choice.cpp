// The attention backend choice with the backend unset that needs no cuDNN: which backwards run on
// our kernel before cuDNN is asked (attention_problem.h).
#include <gtest/gtest.h>

#include "ops/attention/attention_problem.h"

namespace {

using primus_turbo::attention::Problem;
using primus_turbo::attention::unset_backward_on_ours;

Problem problem(int32_t head_dim, bool sink) {
  static const float sink_logits[8] = {};
  Problem p;
  p.params.head_dim = p.params.head_dim_v = head_dim;
  p.params.sink = sink ? sink_logits : nullptr;
  return p;
}

TEST(AttentionChoice, DeterministicBackwardRunsOnOurs) {
  for (int32_t d : {64, 128, 192}) {
    EXPECT_TRUE(unset_backward_on_ours(problem(d, false), true)) << d;
    EXPECT_TRUE(unset_backward_on_ours(problem(d, true), true)) << d;
  }
}

TEST(AttentionChoice, HeadDim64WithSinksRunsOnOurs) {
  EXPECT_TRUE(unset_backward_on_ours(problem(64, true), false));
  EXPECT_FALSE(unset_backward_on_ours(problem(64, false), false));   // without sinks: cuDNN first
  EXPECT_FALSE(unset_backward_on_ours(problem(128, true), false));   // within 5% of ours there: cuDNN first
  EXPECT_FALSE(unset_backward_on_ours(problem(128, false), false));
}

}  // namespace
