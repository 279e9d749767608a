#include "server/optimizer.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

// Values are stored as float, so a few ulps of drift over steps is expected.
constexpr double kTol = 1e-6;

std::unique_ptr<Optimizer> Make(const OptimizerConfig& cfg) {
  auto opt = Optimizer::Create(cfg);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return std::move(opt).value();
}

// One element: value w and its state, initialised by the optimizer.
struct Elem {
  explicit Elem(const Optimizer& opt) : state(opt.state_floats() + 1) {
    opt.Init(&w, state.data(), 1);
  }
  float w = 123;  // overwritten by Init
  std::vector<float> state;
};

float Step(const Optimizer& opt, Elem* e, float g) {
  opt.Apply(&e->w, e->state.data(), &g, 1);
  return e->w;
}

TEST(OptimizerTest, CreateRejectsUnknownName) {
  OptimizerConfig cfg;
  cfg.name = "rmsprop";
  auto opt = Optimizer::Create(cfg);
  ASSERT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(opt.status().message().find("optimizer.name"), std::string::npos)
      << opt.status();
}

TEST(OptimizerTest, CreateRejectsBadParameters) {
  OptimizerConfig cfg;
  cfg.name = "sgd";
  cfg.learning_rate = 0;
  auto opt = Optimizer::Create(cfg);
  ASSERT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(opt.status().message().find("optimizer.learning_rate"),
            std::string::npos);

  cfg = OptimizerConfig();
  cfg.name = "ftrl";
  cfg.alpha = -1;
  opt = Optimizer::Create(cfg);
  ASSERT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(opt.status().message().find("optimizer.alpha"), std::string::npos);

  cfg = OptimizerConfig();
  cfg.l1 = NAN;
  opt = Optimizer::Create(cfg);
  ASSERT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(opt.status().message().find("optimizer.l1"), std::string::npos);

  cfg = OptimizerConfig();
  cfg.name = "adagrad";
  cfg.initial_accumulator = 0;
  opt = Optimizer::Create(cfg);
  ASSERT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(opt.status().message().find("optimizer.initial_accumulator"),
            std::string::npos);
}

TEST(OptimizerTest, StateFloats) {
  OptimizerConfig cfg;
  const std::pair<const char*, int> expected[] = {
      {"sgd", 0}, {"adagrad", 1}, {"ftrl", 2}, {"adam", 3}};
  for (const auto& [name, floats] : expected) {
    cfg.name = name;
    EXPECT_EQ(Make(cfg)->state_floats(), floats) << name;
    EXPECT_STREQ(OptimizerKindName(Make(cfg)->kind()), name);
  }
}

TEST(OptimizerTest, SgdWithL2) {
  OptimizerConfig cfg;
  cfg.name = "sgd";
  cfg.learning_rate = 0.1;
  cfg.l1 = 0;
  cfg.l2 = 0.5;
  auto opt = Make(cfg);
  Elem e(*opt);
  EXPECT_EQ(e.w, 0.0f);
  // w = 0 - 0.1 * (2 + 0.5*0) = -0.2
  EXPECT_NEAR(Step(*opt, &e, 2.0f), -0.2, kTol);
  // w = -0.2 - 0.1 * (-1 + 0.5*(-0.2)) = -0.2 + 0.11 = -0.09
  EXPECT_NEAR(Step(*opt, &e, -1.0f), -0.09, kTol);
}

TEST(OptimizerTest, SgdL1ProximalStepZeroes) {
  // Binary-exact numbers, so the zero is exact rather than a rounding
  // residue.
  OptimizerConfig cfg;
  cfg.name = "sgd";
  cfg.learning_rate = 0.25;
  cfg.l1 = 1.0;
  cfg.l2 = 0;
  auto opt = Make(cfg);
  Elem e(*opt);
  // w = 0 - 0.25*(-3) = 0.75, shrink by lr*l1 = 0.25 -> 0.5
  EXPECT_EQ(Step(*opt, &e, -3.0f), 0.5f);
  // w = 0.5 - 0.25*1 = 0.25, shrink by 0.25 -> exactly 0
  EXPECT_EQ(Step(*opt, &e, 1.0f), 0.0f);
  // w = 0 - 0.25*0.5 = -0.125: inside the threshold -> 0
  EXPECT_EQ(Step(*opt, &e, 0.5f), 0.0f);
  // Negative side: w = -0.75, shrink toward 0 -> -0.5
  EXPECT_EQ(Step(*opt, &e, 3.0f), -0.5f);
}

TEST(OptimizerTest, Adagrad) {
  OptimizerConfig cfg;
  cfg.name = "adagrad";
  cfg.learning_rate = 0.5;
  cfg.initial_accumulator = 1.0;
  cfg.l1 = 0;
  cfg.l2 = 0;
  auto opt = Make(cfg);
  Elem e(*opt);
  EXPECT_EQ(e.state[0], 1.0f);
  // n = 1 + 9 = 10; w = -0.5 * 3 / sqrt(10) = -0.474341649
  EXPECT_NEAR(Step(*opt, &e, 3.0f), -0.4743416490252569, kTol);
  EXPECT_EQ(e.state[0], 10.0f);
  // n = 11; w = -0.474341649 + 0.5 / sqrt(11) = -0.323585977
  EXPECT_NEAR(Step(*opt, &e, -1.0f), -0.32358597673637507, kTol);
  EXPECT_EQ(e.state[0], 11.0f);
}

TEST(OptimizerTest, AdagradWithL1AndL2) {
  OptimizerConfig cfg;
  cfg.name = "adagrad";
  cfg.learning_rate = 0.5;
  cfg.initial_accumulator = 1.0;
  cfg.l1 = 0.2;
  cfg.l2 = 0.5;
  auto opt = Make(cfg);
  Elem e(*opt);
  // g' = 2; n = 5; eta = 0.5/sqrt(5) = 0.2236068; w = -0.4472136;
  // shrink by eta*0.2 = 0.0447214 -> -0.4024922
  EXPECT_NEAR(Step(*opt, &e, 2.0f), -0.40249223594996214, kTol);
  // g' = -0.1 + 0.5*(-0.4024922) = -0.3012461; n = 5.0907492;
  // eta = 0.2216046; w = -0.4024922 + 0.0667573 = -0.3357349;
  // shrink by 0.0443209 -> -0.2914137
  EXPECT_NEAR(Step(*opt, &e, -0.1f), -0.29141369292832087, kTol);
  EXPECT_NEAR(e.state[0], 5.0907492235949965, kTol);
}

TEST(OptimizerTest, AdagradL1ProximalStepZeroes) {
  OptimizerConfig cfg;
  cfg.name = "adagrad";
  cfg.learning_rate = 0.5;
  cfg.initial_accumulator = 1.0;
  cfg.l1 = 1.0;
  cfg.l2 = 0;
  auto opt = Make(cfg);
  Elem e(*opt);
  // n = 1.25; eta = 0.4472136; w = -0.2236068; |w| < eta*l1 -> 0
  EXPECT_EQ(Step(*opt, &e, 0.5f), 0.0f);
  EXPECT_EQ(e.state[0], 1.25f);
}

TEST(OptimizerTest, FtrlWithL1Zeroing) {
  OptimizerConfig cfg;
  cfg.name = "ftrl";
  cfg.alpha = 0.5;
  cfg.beta = 1.0;
  cfg.l1 = 1.0;
  cfg.l2 = 1.0;
  auto opt = Make(cfg);
  Elem e(*opt);
  // sigma = (3 - 0)/0.5 = 6; z = 3 - 6*0 = 3; n = 9;
  // w = -(3 - 1) / ((1 + 3)/0.5 + 1) = -2/9
  EXPECT_NEAR(Step(*opt, &e, 3.0f), -2.0 / 9.0, kTol);
  EXPECT_EQ(e.state[0], 3.0f);  // z
  EXPECT_EQ(e.state[1], 9.0f);  // n
  // sigma = (sqrt(10) - 3)/0.5 = 0.3245553; z = 3 - 1 + 0.3245553*2/9
  // = 2.0721234; n = 10; w = -1.0721234 / ((1 + sqrt(10))/0.5 + 1)
  // = -0.1149785
  EXPECT_NEAR(Step(*opt, &e, -1.0f), -0.11497850221135904, kTol);
  EXPECT_NEAR(e.state[0], 2.07212340451928, kTol);
  EXPECT_EQ(e.state[1], 10.0f);
  // sigma = (3.5 - sqrt(10))/0.5 = 0.6754447; z = 2.0721234 - 1.5
  // + 0.6754447*(-0.1149785)... = 0.6497850 <= l1 -> w = 0 exactly
  EXPECT_EQ(Step(*opt, &e, -1.5f), 0.0f);
  EXPECT_NEAR(e.state[0], 0.6497850221135903, kTol);
  EXPECT_EQ(e.state[1], 12.25f);
}

TEST(OptimizerTest, Adam) {
  OptimizerConfig cfg;
  cfg.name = "adam";
  cfg.learning_rate = 0.1;
  cfg.l2 = 0;
  auto opt = Make(cfg);
  Elem e(*opt);
  // m = 0.1, v = 0.001, m^ = 1, v^ = 1: w = -0.1 / (1 + 1e-8)
  EXPECT_NEAR(Step(*opt, &e, 1.0f), -0.1, kTol);
  EXPECT_EQ(e.state[2], 1.0f);  // step count
  // m = 0.09 - 0.1 = -0.01, v = 0.000999 + 0.001 = 0.001999;
  // m^ = -0.01/0.19 = -0.0526316, v^ = 0.001999/0.001999 = 1;
  // w = -0.1 + 0.1*0.0526316 = -0.0947368
  EXPECT_NEAR(Step(*opt, &e, -1.0f), -0.09473684115789487, kTol);
  // m = 0.041, v = 0.002247001; m^ = 0.041/0.271 = 0.1512915,
  // v^ = 0.002247001/0.002997001 = 0.7497498; w -= 0.1*0.1512915/0.8658809
  EXPECT_NEAR(Step(*opt, &e, 0.5f), -0.11220939437527776, kTol);
  EXPECT_EQ(e.state[2], 3.0f);
}

TEST(OptimizerTest, ScaleMultipliesGradient) {
  OptimizerConfig cfg;
  cfg.name = "adagrad";
  cfg.learning_rate = 0.5;
  cfg.initial_accumulator = 1.0;
  cfg.l1 = 0;
  cfg.l2 = 0;
  auto opt = Make(cfg);
  Elem a(*opt), b(*opt);
  float g6 = 6.0f, g3 = 3.0f;
  opt->Apply(&a.w, a.state.data(), &g6, 0.5f, 1);
  opt->Apply(&b.w, b.state.data(), &g3, 1);
  EXPECT_EQ(a.w, b.w);
  EXPECT_EQ(a.state[0], b.state[0]);
}

TEST(OptimizerTest, RunOfElementsMatchesOneByOne) {
  // A multi-element Apply is the element-wise rule with interleaved state.
  for (const char* name : {"sgd", "adagrad", "ftrl", "adam"}) {
    OptimizerConfig cfg;
    cfg.name = name;
    cfg.l1 = 0.01;
    cfg.l2 = 0.1;
    auto opt = Make(cfg);
    const int sf = opt->state_floats();
    const float g[3] = {0.5f, -2.0f, 1.25f};
    std::vector<float> w(3), state(3 * sf + 1);
    opt->Init(w.data(), state.data(), 3);
    for (int step = 0; step < 3; ++step) {
      opt->Apply(w.data(), state.data(), g, 3);
    }
    for (int i = 0; i < 3; ++i) {
      Elem e(*opt);
      for (int step = 0; step < 3; ++step) Step(*opt, &e, g[i]);
      EXPECT_EQ(w[i], e.w) << name << " element " << i;
      for (int k = 0; k < sf; ++k) {
        EXPECT_EQ(state[i * sf + k], e.state[k]) << name;
      }
    }
  }
}

// A finite gradient too large for single precision would overflow an
// accumulator or a weight (FTRL then held NaN for good: inf * 0). Such an
// element keeps its value and state, and Apply counts it; the next
// ordinary gradient updates it as if the large one never came.
TEST(OptimizerTest, UpdateThatWouldNotBeFiniteLeavesTheElementAsItWas) {
  for (const char* name : {"sgd", "adagrad", "ftrl", "adam"}) {
    SCOPED_TRACE(name);
    OptimizerConfig cfg;
    cfg.name = name;
    cfg.learning_rate = 0.5;
    cfg.alpha = 0.1;
    cfg.beta = 1.0;
    cfg.l1 = 0.01;
    cfg.l2 = 0.01;
    cfg.initial_accumulator = 0.1;
    auto opt = Make(cfg);
    Elem a(*opt), b(*opt);
    Step(*opt, &a, 1.0f);
    Step(*opt, &b, 1.0f);
    const std::vector<float> before_state = a.state;
    const float before_w = a.w;
    // sgd: w - 0.5 * 3e38 * 2 overflows; the others square the gradient.
    const float huge[2] = {3e38f, -3e38f};
    float w2[2] = {a.w, a.w};
    std::vector<float> s2(2 * opt->state_floats() + 1);
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < opt->state_floats(); ++j) {
        s2[i * opt->state_floats() + j] = a.state[j];
      }
    }
    EXPECT_EQ(opt->Apply(w2, s2.data(), huge, 2.0f, 2), 2u);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(w2[i], before_w);
      for (int j = 0; j < opt->state_floats(); ++j) {
        EXPECT_EQ(s2[i * opt->state_floats() + j], before_state[j]);
      }
    }
    float g = 3e38f;
    EXPECT_EQ(opt->Apply(&a.w, a.state.data(), &g, 2.0f, 1), 1u);
    EXPECT_EQ(a.w, before_w);
    EXPECT_EQ(a.state, before_state);
    // Then as b, which never saw it.
    EXPECT_EQ(Step(*opt, &a, -0.5f), Step(*opt, &b, -0.5f));
    EXPECT_EQ(a.state, b.state);
    EXPECT_TRUE(std::isfinite(a.w));
    // An ordinary gradient counts nothing.
    g = 2.0f;
    EXPECT_EQ(opt->Apply(&a.w, a.state.data(), &g, 1.0f, 1), 0u);
  }
}

}  // namespace
}  // namespace ps
