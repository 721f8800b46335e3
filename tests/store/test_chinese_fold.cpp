// Tests of the suffix keyer's Traditional-to-Simplified folding
// (lib/store/chinese_fold.hpp, OpenCC's t2s.json): the support bot's
// sentences, text left alone (Simplified, ASCII, other scripts), mixed text,
// invalid UTF-8, many threads at once, an independent list of character pairs,
// and what config_name() and the dictionaries' paths depend on.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "store/chinese_fold.hpp"
#include "temp_dir.hpp"

using clm::StatusCode;
using clm::store_detail::ChineseFolder;

namespace {

std::unique_ptr<ChineseFolder> open_folder() {
  std::unique_ptr<ChineseFolder> folder;
  const clm::Status s = ChineseFolder::create(folder);
  INFO(s.message());
  REQUIRE(s.ok());
  REQUIRE(folder != nullptr);
  return folder;
}

std::string fold(const ChineseFolder& folder, std::string_view text) {
  std::string out;
  const clm::Status s = folder.fold(text, out);
  INFO(s.message());
  REQUIRE(s.ok());
  return out;
}

std::string data_dir() { return std::filesystem::path(CLM_OPENCC_T2S_CONFIG).parent_path().string(); }

// OpenCC's t2s.json and its two dictionaries, copied into `dir`.
void copy_t2s(const clm_test::TempDir& dir) {
  for (const char* f : {"t2s.json", "TSPhrases.ocd2", "TSCharacters.ocd2"}) {
    std::filesystem::copy_file(data_dir() + "/" + f, dir.file(f));
  }
}

// Changes the working directory for the scope, and back.
class WorkingDir {
 public:
  explicit WorkingDir(const std::string& dir) : old_(std::filesystem::current_path()) {
    std::filesystem::current_path(dir);
  }
  ~WorkingDir() {
    std::error_code ignored;
    std::filesystem::current_path(old_, ignored);
  }
  WorkingDir(const WorkingDir&) = delete;
  WorkingDir& operator=(const WorkingDir&) = delete;

 private:
  std::filesystem::path old_;
};

}  // namespace

TEST_CASE("chinese fold: the support bot's Traditional sentences become Simplified", "[chinese_fold]") {
  const auto folder = open_folder();
  CHECK(fold(*folder, "請幫我取消訂單") == "请帮我取消订单");
  // t2s folds 重設密碼 character by character (TSPhrases has no entry for
  // it): 設 -> 设, 碼 -> 码; 重 and 密 are the same in both scripts.
  CHECK(fold(*folder, "重設密碼") == "重设密码");
  CHECK(fold(*folder, "我的帳號登錄不了") == "我的帐号登录不了");
  CHECK(fold(*folder, "退貨退款要多久") == "退货退款要多久");
  // Phrases before characters: 乾 is 干 in 乾燥 but stays in the name 乾隆.
  CHECK(fold(*folder, "乾燥") == "干燥");
  CHECK(fold(*folder, "乾隆") == "乾隆");
}

TEST_CASE("chinese fold: Simplified, ASCII and other scripts are returned unchanged", "[chinese_fold]") {
  const auto folder = open_folder();
  for (const std::string text :
       {"", "请帮我取消订单", "重设密码", "where is my order #A-1234?", "ORDER 789\tstatus\n", "ありがとうございます",
        "주문을 취소해 주세요", "café déjà vu", "😀 👍", "，。！？「」", "请帮我取消订单，谢谢！"}) {
    CHECK(fold(*folder, text) == text);
  }
  // The same held for a NUL, which OpenCC (C strings) would stop at.
  const std::string nul("a\0b", 3);
  CHECK(fold(*folder, nul) == nul);
}

TEST_CASE("chinese fold: mixed text folds only its Traditional characters", "[chinese_fold]") {
  const auto folder = open_folder();
  CHECK(fold(*folder, "請幫我取消訂單 #A-123, thanks!") == "请帮我取消订单 #A-123, thanks!");
  CHECK(fold(*folder, "Order 789：請問訂單狀態？") == "Order 789：请问订单状态？");
  CHECK(fold(*folder, "重設密碼 / reset password / 重设密码") == "重设密码 / reset password / 重设密码");
  CHECK(fold(*folder, "訂單ありがとう單") == "订单ありがとう单");
  CHECK(fold(*folder, std::string("訂\0單", 7)) == std::string("订\0单", 7));
  // `out` may be the text itself.
  std::string text = "請幫我";
  REQUIRE(folder->fold(text, text).ok());
  CHECK(text == "请帮我");
  std::string ascii = "plain";
  REQUIRE(folder->fold(ascii, ascii).ok());
  CHECK(ascii == "plain");
}

TEST_CASE("chinese fold: invalid UTF-8 is an invalid_argument naming the byte", "[chinese_fold]") {
  const auto folder = open_folder();
  const std::vector<std::pair<std::string, std::size_t>> bad = {
      {"\xff", 0},
      {"abc\x80", 3},               // a stray continuation byte
      {"\xe8\xa8", 0},              // 訂 (E8 A8 82) cut short
      {"\xc0\xaf", 0},              // an overlong '/'
      {"\xed\xa0\x80", 0},          // a surrogate
      {"\xf4\x90\x80\x80", 0},      // past U+10FFFF
      {"\xe8\xa8\x82\xe5\x96", 3},  // 訂 then a truncated 單: checked before OpenCC sees the 訂
      {"請幫我取消訂單\xfe", 21}};
  for (const auto& [text, at] : bad) {
    std::string out = "unchanged";
    const clm::Status s = folder->fold(text, out);
    INFO(text.size() << " bytes: " << s.message());
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK(s.message().find("byte " + std::to_string(at)) != std::string::npos);
  }
}

TEST_CASE("chinese fold: many threads folding at once agree with one thread", "[chinese_fold][threads]") {
  const auto folder = open_folder();
  const std::vector<std::string> inputs = {
      "請幫我取消訂單", "重設密碼",       "我的帳號登錄不了",   "plain ascii", "請問訂單 #42 的狀態",
      "退貨退款",       "请帮我取消订单", "乾隆年間的乾燥天氣", "頭髮和發展",  "臺灣的雲與萬"};
  std::vector<std::string> expected;
  for (const auto& in : inputs) expected.push_back(fold(*folder, in));

  constexpr int kThreads = 8;
  constexpr int kRounds = 300;
  std::vector<int> mismatches(kThreads, 0), errors(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::string out;
      for (int r = 0; r < kRounds; ++r) {
        for (std::size_t i = 0; i < inputs.size(); ++i) {
          const std::size_t k = (i + static_cast<std::size_t>(t)) % inputs.size();  // threads out of step
          if (!folder->fold(inputs[k], out).ok()) {
            ++errors[t];
          } else if (out != expected[k]) {
            ++mismatches[t];
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    INFO("thread " << t);
    CHECK(errors[t] == 0);
    CHECK(mismatches[t] == 0);
  }
}

TEST_CASE("chinese fold: an independent list of Traditional/Simplified character pairs", "[chinese_fold]") {
  // Written from the Table of General Standard Chinese Characters (2013), not
  // from OpenCC's data: pairs whose Simplified form is the only one.
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"訂", "订"}, {"單", "单"}, {"請", "请"}, {"幫", "帮"}, {"設", "设"}, {"碼", "码"}, {"號", "号"}, {"帳", "帐"},
      {"賬", "账"}, {"貨", "货"}, {"錢", "钱"}, {"買", "买"}, {"賣", "卖"}, {"電", "电"}, {"話", "话"}, {"網", "网"},
      {"頁", "页"}, {"題", "题"}, {"問", "问"}, {"關", "关"}, {"開", "开"}, {"門", "门"}, {"車", "车"}, {"東", "东"},
      {"國", "国"}, {"語", "语"}, {"說", "说"}, {"讀", "读"}, {"寫", "写"}, {"聽", "听"}, {"見", "见"}, {"學", "学"},
      {"書", "书"}, {"業", "业"}, {"氣", "气"}, {"體", "体"}, {"點", "点"}, {"務", "务"}, {"認", "认"}, {"證", "证"},
      {"驗", "验"}, {"變", "变"}, {"處", "处"}, {"應", "应"}, {"運", "运"}, {"費", "费"}, {"額", "额"}, {"們", "们"},
      {"這", "这"}, {"個", "个"}, {"時", "时"}, {"間", "间"}, {"為", "为"}, {"從", "从"}, {"來", "来"}, {"對", "对"},
      {"過", "过"}, {"還", "还"}, {"進", "进"}, {"錯", "错"}, {"誤", "误"}, {"萬", "万"}, {"與", "与"}, {"雲", "云"},
      {"鐘", "钟"}, {"歷", "历"}, {"曆", "历"}, {"髮", "发"}, {"發", "发"}, {"狀", "状"}, {"態", "态"}, {"鬆", "松"}};
  REQUIRE(pairs.size() >= 30);
  const auto folder = open_folder();
  for (const auto& [trad, simp] : pairs) {
    INFO(trad << " -> " << simp);
    CHECK(fold(*folder, trad) == simp);
    CHECK(fold(*folder, simp) == simp);  // Simplified is a fixed point
  }
}

TEST_CASE("chinese fold: config_name names OpenCC, t2s.json and a hash of its data", "[chinese_fold]") {
  const auto folder = open_folder();
  const std::string name = folder->config_name();
  INFO(name);
  CHECK(name.rfind("OpenCC ", 0) == 0);
  CHECK(name.find(" t2s.json data:") != std::string::npos);
  CHECK(name.size() == name.find(" data:") + 6 + 16);

  // The same files elsewhere: the same name. Another TSCharacters: another.
  clm_test::TempDir dir("chinese-fold");
  copy_t2s(dir);
  std::unique_ptr<ChineseFolder> copy;
  REQUIRE(ChineseFolder::create(dir.file("t2s.json"), copy).ok());
  CHECK(copy->config_name() == name);
  {
    WorkingDir cwd(dir.str());  // a relative path: the working directory's copy
    std::unique_ptr<ChineseFolder> relative;
    REQUIRE(ChineseFolder::create("t2s.json", relative).ok());
    CHECK(relative->config_name() == name);
  }
  std::filesystem::copy_file(data_dir() + "/STCharacters.ocd2", dir.file("TSCharacters.ocd2"),
                             std::filesystem::copy_options::overwrite_existing);
  std::unique_ptr<ChineseFolder> other;
  REQUIRE(ChineseFolder::create(dir.file("t2s.json"), other).ok());
  CHECK(other->config_name() != name);
  CHECK(fold(*other, "请") == "請");  // STCharacters folds the other way
}

TEST_CASE("chinese fold: dictionaries come from the configuration's folder, not the working directory",
          "[chinese_fold]") {
  // OpenCC alone would load a TSCharacters.ocd2 from the working directory
  // first: here one that folds the other way.
  clm_test::TempDir dir("chinese-fold-cwd");
  std::filesystem::copy_file(data_dir() + "/STCharacters.ocd2", dir.file("TSCharacters.ocd2"));
  std::filesystem::copy_file(data_dir() + "/STPhrases.ocd2", dir.file("TSPhrases.ocd2"));
  const std::string expected_name = open_folder()->config_name();
  WorkingDir cwd(dir.str());
  const auto folder = open_folder();
  CHECK(fold(*folder, "請幫我取消訂單") == "请帮我取消订单");
  CHECK(fold(*folder, "请") == "请");
  CHECK(folder->config_name() == expected_name);
}

TEST_CASE("chinese fold: a missing or unusable configuration is an error, not an exception", "[chinese_fold]") {
  std::unique_ptr<ChineseFolder> folder;
  clm::Status s = ChineseFolder::create("/nonexistent/opencc/t2s.json", folder);
  CHECK(s.code() == StatusCode::io_error);
  CHECK(s.message().find("/nonexistent/opencc/t2s.json") != std::string::npos);
  CHECK(folder == nullptr);

  clm_test::TempDir dir("chinese-fold-bad");
  dir.write("none.json", R"({"name": "no dictionaries", "conversion_chain": []})");
  s = ChineseFolder::create(dir.file("none.json"), folder);
  CHECK(s.code() == StatusCode::invalid_argument);

  // A dictionary that is not there.
  copy_t2s(dir);
  std::filesystem::remove(dir.file("TSPhrases.ocd2"));
  s = ChineseFolder::create(dir.file("t2s.json"), folder);
  CHECK(s.code() == StatusCode::io_error);
  CHECK(s.message().find("TSPhrases.ocd2") != std::string::npos);
  dir.write("broken.json",
            R"({"name": "broken", "segmentation": {"type": "mmseg", "dict": {"type": "ocd2", "file": ")");
  s = ChineseFolder::create(dir.file("broken.json"), folder);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(folder == nullptr);
}
