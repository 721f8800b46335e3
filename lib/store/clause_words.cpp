// lib/store/clause_words.cpp: one request said in other words made one clause
// (key_clause.hpp): a new card asked for is its replacement, closing an account
// cancels it, a supply reconnected resumes, what is left is the balance, and
// the like. Each rule reads one clause the key rules made (key_rules.cpp) and
// changes it only when it says the same request another way; each has tests in
// tests/test_suffix_key.cpp that fail with it switched off.
#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

#include "key_clause.hpp"

namespace clm::store_detail {

namespace {

// Whether an object is a card or a document one carries, replaced or reissued when worn, lost or stolen.
bool is_card_like(const Element& o) {
  return name_in(o.text, {"CARD", "DEBIT_CARD", "CREDIT_CARD", "SIM", "ESIM", "PASSPORT", "DRIVING_LICENSE", "IDENTITY",
                          "MEMBERSHIP_CARD", "MEDICAL_INSURANCE_CARD", "PATIENT_CARD", "PRIMARY_CARD", "SECONDARY_CARD",
                          "RAILCARD", "PIN", "CHEQUE_BOOK"});
}

// A thing named by a verb's noun, a request in itself: "a refund for my order" asks to refund it.
bool is_verb_named(const Element& o) { return name_in(o.text, {"RETURN", "REFUND", "EXCHANGE"}); }

// A detail that ranks or sequences what it describes: "first", "later", "over" ("my business account over my
// personal one"), "next".
bool is_ordering(const Element& d) { return name_in(d.text, {"FIRST", "LATER", "ABOVE", "NEXT"}); }

// An action's name without the mark of what was done: "EXCHANGE_DONE" is "EXCHANGE".
std::string_view verb_of(const Element& a) { return std::string_view(a.text).substr(0, a.text.find("_DONE")); }

// "Again" is in the action where the action has a form for it, as restart,
// reissue and resend do: "enable roaming again" is "re-enable roaming",
// 重新开通自动续费 is 恢复自动续费 ("turn it on again": resume), 重新寄一个 is 补发
// (resend is send), 再加一张床 is 加一张床. A thing asked for again is the thing
// ("I need my invoice again"), a problem again the problem. With two actions
// asked for, which one is again is not known: it stays.
void again_into_action(Clause& c) {
  const auto again =
      std::find_if(c.details.begin(), c.details.end(), [](const Element& d) { return d.text == "AGAIN"; });
  if (again == c.details.end()) return;
  if (c.objects.empty() && c.entities.empty() &&
      std::all_of(c.actions.begin(), c.actions.end(), [](const Element& a) { return a.text == "QUERY"; })) {
    return;  // "again" alone
  }
  Element* asked = nullptr;
  for (Element& a : c.actions) {
    if (a.past || a.nominal) continue;  // "send the activation code again": the sending
    if (asked != nullptr) return;
    asked = &a;
  }
  if (asked != nullptr) {
    std::string& action = asked->text;
    if (action == "ENABLE" || action == "START") {
      action = "RESUME";
    } else if (action == "OPEN") {
      action = "REOPEN";  // "open my ticket again" is "reopen my ticket"
    } else if (action == "ISSUE" ||
               (action == "PROCESS" && std::any_of(c.objects.begin(), c.objects.end(), is_card_like))) {
      // 储蓄卡要重新办一张: a card processed again is reissued, as 补办 is.
      action = "REISSUE";
    } else if (action != "SEND" && action != "SHIP" && action != "ADD" && action != "QUERY" && action != "RESUME" &&
               action != "REISSUE") {
      return;
    }
  } else if (!c.actions.empty()) {
    return;  // "it was cancelled again": what happened, again
  }
  c.details.erase(again);
  // A QUERY that "again" alone made (a statement of details: 订单再) goes with it: "order again" is no
  // "check my order".
  if (c.states && c.details.empty()) {
    std::erase_if(c.actions, [](const Element& a) { return a.text == "QUERY"; });
    c.states = false;
  }
}

// A change, an exchange or a reissue is for a new one: "swap out my router
// for a new one" is "replace my router", 换个新手机号 is 换手机号. (To the new
// one, not a new one, or new beside old still say which.)
void new_in_replacement(Clause& c) {
  const Element* replacing = nullptr;
  for (const Element& a : c.actions) {
    if (a.nominal) continue;
    if (replacing != nullptr) return;
    replacing = &a;
  }
  if (replacing == nullptr || replacing->negated) return;
  const std::string_view action = std::string_view(replacing->text).substr(0, replacing->text.find("_DONE"));
  if (action != "CHANGE" && action != "EXCHANGE" && action != "REISSUE") return;
  // "replace my old card with the new one" is not "replace the new card with my old one".
  const auto names_the_other = [](const Element& d) {
    return d.text == "OLD" || d.text == "ORIGINAL" || d.text == "CURRENT";
  };
  if (std::any_of(c.details.begin(), c.details.end(), names_the_other)) return;
  std::erase_if(c.details, [](const Element& d) { return d.text == "NEW" && !d.negated; });
  // And to a different one, another day: "move me to a different seat" is "change my seat",
  // "move my appointment to another day" is "reschedule my appointment".
  std::vector<Element> kept;
  for (std::size_t i = 0; i < c.details.size(); ++i) {
    const Element& d = c.details[i];
    if (!d.negated && (d.text == "TO.DIFFERENT" || d.text == "TO.ANOTHER")) {
      const bool unnamed_when =
          i + 1 < c.details.size() &&
          (c.details[i + 1].text == "DAY" || c.details[i + 1].text == "TIME" || c.details[i + 1].text == "DATE");
      if (unnamed_when) ++i;
      continue;
    }
    kept.push_back(d);
  }
  c.details = std::move(kept);
}

// Verbs that only carry another: whether a change went through is whether it
// was made ("did my address change go through?" = "has my address been
// updated?", 改签成功了吗 = 改签好了没; "go through with the deletion" is
// "delete it"); 办 / process asked for with another action is that action
// (帮我办护照续签 = 续签护照), and alone the thing it names (办延迟退房 =
// 我想晚点退房). Asked about, processing is the question (护照办好了吗).
void drop_carrier_verbs(Clause& c) {
  const auto is = [](std::string_view name) {
    return [name](const Element& a) { return a.text == name && !a.negated && !a.past; };
  };
  const auto others = [&c](std::string_view name) {
    return std::any_of(c.actions.begin(), c.actions.end(), [name](const Element& a) { return a.text != name; });
  };
  if (others("SUCCEED")) std::erase_if(c.actions, is("SUCCEED"));
  if (c.mood.empty() && (others("PROCESS") || (!c.objects.empty() && c.actions.size() == 1))) {
    std::erase_if(c.actions, is("PROCESS"));
  }
}

// Money returned is a refund (把钱退给我 = 我要退款, 机票的钱退给我 = 机票退款), and
// money transferred, paid or charged is the transfer, the payment, the charge
// (转钱 = 转账, 扣了两次钱 = 重复扣款).
void money_in_its_action(Clause& c) {
  for (std::size_t i = 0; i + 1 < c.objects.size(); ++i) {
    Element& a = c.objects[i];
    const Element& b = c.objects[i + 1];
    if (a.negated == b.negated &&
        ((a.text == "MONEY" && b.text == "RETURN") || (a.text == "RETURN" && b.text == "MONEY"))) {
      a.text = "REFUND";
      c.objects.erase(c.objects.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    }
  }
  const auto moves_money = [](const Element& a) {
    const std::string_view action = std::string_view(a.text).substr(0, a.text.find("_DONE"));
    return action == "TRANSFER" || action == "PAY" || action == "CHARGE";
  };
  const auto is_money = [](const Element& o) { return o.text == "MONEY" && !o.negated; };
  const auto money = static_cast<std::size_t>(std::count_if(c.objects.begin(), c.objects.end(), is_money));
  // ("transfer the money" alone keeps it: which money, the conversation says.)
  if (std::any_of(c.actions.begin(), c.actions.end(), moves_money) && c.objects.size() + c.entities.size() > money) {
    std::erase_if(c.objects, is_money);
  }
}

// An account's own attribute names the account: "change my account password"
// is "change my password", 给账号打开双重认证 is 开启两步验证, "my account
// statement" is "my statement". (To or from an account still says where.)
void account_of_its_attribute(Clause& c) {
  const auto is_attribute = [](const Element& o) {
    return !o.negated &&
           name_in(o.text, {"PASSWORD", "EMAIL", "PHONE", "TWO_FACTOR", "STATEMENT", "USERNAME", "SECURITY_QUESTION"});
  };
  // With two actions the account may be the other's ("reset my password and unlock my account").
  if (c.actions.size() > 1 || std::none_of(c.objects.begin(), c.objects.end(), is_attribute)) return;
  std::erase_if(c.objects, [](const Element& o) { return o.text == "ACCOUNT" && !o.negated; });
}

// A phone's own service names the phone, as an account's attribute names
// the account: "disable roaming on my phone" is "turn off roaming", 手机短信
// 收不到 is 收不到短信, "end my phone contract" is "cancel my contract". (A code
// or a call may come by phone or by another way, and calls forwarded go from
// one phone to another: the phone stays beside them.)
void phone_of_its_service(Clause& c) {
  const auto is_service = [](const Element& o) {
    return !o.negated &&
           name_in(o.text, {"ROAMING", "SMS", "DATA", "SIM", "ESIM", "VOICEMAIL", "DATA_PACK", "CONTRACT"});
  };
  if (std::none_of(c.objects.begin(), c.objects.end(), is_service)) return;
  std::erase_if(c.objects, [](const Element& o) { return o.text == "PHONE" && !o.negated; });
}

// A delivery's own label names the delivery: "a return shipping label" is
// "a return label", 退货快递面单 is 退货标签. (A driver is not the delivery's
// own: "is my parcel with the driver today?" names both.)
void delivery_of_its_label(Clause& c) {
  const auto label = [](const Element& o) { return o.text == "LABEL" && !o.negated; };
  if (std::none_of(c.objects.begin(), c.objects.end(), label)) return;
  std::erase_if(c.objects, [](const Element& o) { return o.text == "DELIVERY" && !o.negated; });
}

// 补卡, 补一张银行卡, 补新卡: a card or an identity document supplied again is
// reissued, as 补办 is (补差价, 补交押金 still make up what is missing).
void reissue_of_a_card(Clause& c) {
  if (c.actions.size() != 1 || c.actions[0].text != "MAKE_UP") return;
  if (std::any_of(c.objects.begin(), c.objects.end(), is_card_like)) c.actions[0].text = "REISSUE";
}

// A new card asked for, with no verb or only sending, is its replacement:
// "send me a new card", "I need a new SIM", "a new PIN for my card" are
// "replace my card", "replace my SIM", "replace the PIN for my card" (not "a new account", which opens one; not beside
// the old or the current one, which still say which).
void new_card_is_its_replacement(Clause& c) {
  const auto card = [](const Element& o) { return !o.negated && is_card_like(o); };
  if (!c.mood.empty() || c.actions.size() > 1 || c.objects.empty() || !c.entities.empty() ||
      !std::all_of(c.objects.begin(), c.objects.end(), card)) {
    return;
  }
  if (!c.actions.empty() && (c.actions[0].text != "SEND" || c.actions[0].negated)) return;
  const auto is_new = [](const Element& d) { return d.text == "NEW" && !d.negated; };
  if (c.details.size() != 1 || !is_new(c.details[0])) return;
  c.details.clear();
  c.actions.assign(1, Element{"EXCHANGE"});
}

// Closing a card or an account, stopping a subscription, an order, a refund,
// a return or a payment, is cancelling it: "close my credit card" is
// "cancel my credit card", "stop my streaming subscription", "stop the return
// I requested" are "cancel" them (closing a ticket or an app stays what it is).
void ending_a_contract_cancels_it(Clause& c) {
  if (c.actions.size() != 1 || c.actions[0].past) return;
  const std::string& action = c.actions[0].text;
  const bool closes = action == "CLOSE";
  const bool ends = action == "END" && c.mood.empty();  // "what's the end date of my membership" asks a date
  if (!closes && !ends) return;
  // A service stopped may be suspended (宽带先停一段时间): only closing it (宽带拆机) cancels it.
  const auto ended = [&](const Element& o) {
    return !o.negated && o.text.find('.') == std::string::npos &&
           ((closes &&
             (is_card_like(o) || name_in(o.text, {"ACCOUNT", "BANK_ACCOUNT", "SAVINGS", "LANDLINE", "BROADBAND"}))) ||
            name_in(o.text, {"SUBSCRIPTION", "MEMBERSHIP", "REFUND", "ORDER", "PAYMENT", "TRANSFER", "DIRECT_DEBIT",
                             "STANDING_ORDER", "CONTRACT", "INSURANCE", "PLAN", "RETURN", "EXCHANGE"}));
  };
  // The last thing named is what ends ("end my mobile contract", "stop my card payment").
  const auto plain = [](const Element& o) { return !o.negated && o.text.find('.') == std::string::npos; };
  if (!c.objects.empty() && ended(c.objects.back()) && std::all_of(c.objects.begin(), c.objects.end(), plain)) {
    c.actions[0].text = "CANCEL";
  }
}

// What is switched on and off: auto-pay, roaming, two-factor sign-in, an alarm ...
bool is_switch(const Element& o) {
  return name_in(o.text, {"AUTO_RENEWAL", "PARENTAL_CONTROLS", "ALARM", "AUTO_PAY", "ROAMING", "NOTIFICATION",
                          "PUSH_NOTIFICATION", "TWO_FACTOR", "VOICEMAIL", "CALL_FORWARDING"});
}

// A product named for a switch: "my roaming add-on" ends or starts as products do.
bool is_product(const Element& p) { return name_in(p.text, {"ADD_ON", "PLAN", "PACKAGE", "BUNDLE", "PASS"}); }

// What is switched on and off is switched off when cancelled: "cancel my
// alarm for tomorrow" is "turn off tomorrow's alarm", 解除家长控制 is
// 把家长控制关掉, "stop auto-renewal on my membership" "turn off automatic
// renewal for my membership". Not a product named for one ("cancel my
// roaming add-on" ends the add-on), nor a direct debit (revoked: it stays).
void cancelling_a_switch_turns_it_off(Clause& c) {
  if (c.actions.size() != 1 || verb_of(c.actions[0]) != "CANCEL" || c.objects.empty()) return;
  const Element& o = c.objects.front();
  if (o.negated || !is_switch(o) || std::any_of(c.objects.begin(), c.objects.end(), is_product)) return;
  c.actions[0].text.replace(0, std::string_view("CANCEL").size(), "DISABLE");
}

// And switched on when set up: "set up auto-pay for my electric bill" is
// "turn on auto-pay for my electric bill", 燃气费设置自动扣款 is 燃气费帮我开通代扣,
// "how do I set up two-factor authentication?" "how do I enable 2FA?". Not
// an alarm or a reminder (setting one up makes a new one: "set an alarm for
// 7" is not "turn my alarm on"), a product named for a switch, or its
// password (语音信箱要设个新密码 is no voicemail turned on).
void setting_up_a_switch_turns_it_on(Clause& c) {
  if (c.actions.size() != 1 || verb_of(c.actions[0]) != "SET_UP" || c.objects.empty()) return;
  const Element& o = c.objects.front();
  if (o.negated || !is_switch(o) || name_in(o.text, {"ALARM", "NOTIFICATION"})) return;
  const auto other_thing = [](const Element& p) { return is_product(p) || name_in(p.text, {"PASSWORD", "PIN"}); };
  if (std::any_of(c.objects.begin(), c.objects.end(), other_thing)) return;
  c.actions[0].text.replace(0, std::string_view("SET_UP").size(), "ENABLE");
}

// Stopping something for a time pauses it: "stop my subscription for now",
// 暂时停掉会员 are "pause my subscription", 暂停会员; and a pause, a freeze or a
// lock is for a time anyway ("temporarily lock my card" is "lock my card").
// (Negated, the time says when: 暂时不要扣 is not 不要扣.)
void stopping_for_a_time_pauses(Clause& c) {
  if (c.actions.size() != 1 || c.actions[0].negated || c.actions[0].past) return;
  std::string& action = c.actions[0].text;
  if (!name_in(action, {"END", "PAUSE", "FREEZE", "LOCK"})) return;
  const auto temporary = [](const Element& d) { return d.text == "TEMPORARY" && !d.negated; };
  if (std::none_of(c.details.begin(), c.details.end(), temporary)) return;
  if (action == "END") action = "PAUSE";
  std::erase_if(c.details, temporary);
}

// Reconnecting a supply restores it ("reconnect my internet" is "restore my
// internet", "turn my gas back on"); reconnecting anything else links it
// again ("reconnect my headphones" is "connect my headphones"). A supply of
// gas is the gas ("my gas supply").
void reconnecting_restores_a_supply(Clause& c) {
  const auto is_supply = [](const Element& o) {
    return name_in(o.text, {"INTERNET", "BROADBAND", "GAS", "ELECTRICITY", "WATER", "SUPPLY", "LANDLINE", "LINE"});
  };
  const bool supplies = !c.objects.empty() && std::all_of(c.objects.begin(), c.objects.end(), is_supply);
  for (Element& a : c.actions) {
    if (a.text.starts_with("RECONNECT")) a.text.replace(0, 9, supplies ? "RESUME" : "BIND");
  }
  // "my gas supply" is my gas.
  if (supplies && c.objects.size() > 1) {
    std::erase_if(c.objects, [](const Element& o) { return o.text == "SUPPLY" && !o.negated; });
  }
}

// The address on my bills is my billing address, when it is changed: "change
// the address on my bills", 更新我的账单寄送地址 are "update my billing address"
// (not "send the invoice to my new address").
void billing_address_of_bills(Clause& c) {
  if (c.actions.size() != 1 || c.actions[0].text != "CHANGE" || c.objects.size() != 2) return;
  const bool names_it = (c.objects[0].text == "INVOICE" && c.objects[1].text == "ADDRESS") ||
                        (c.objects[0].text == "ADDRESS" && c.objects[1].text == "INVOICE");
  if (!names_it || c.objects[0].negated || c.objects[1].negated) return;
  c.objects.assign(1, Element{"BILLING_ADDRESS"});
}

// Marketing messages, notifications or newsletters one no longer wants are
// not to be sent: "unsubscribe me from marketing emails", "stop sending me
// marketing emails", "I don't want to receive marketing emails", 退订营销邮件
// are "don't send me marketing emails" (别再给我发推广邮件了), 退订短信通知 is
// 短信通知别发了.
void no_more_marketing(Clause& c) {
  if (!c.mood.empty() || c.objects.empty() || !c.entities.empty()) return;
  const auto is_message = [](const Element& o) {
    return !o.negated && name_in(o.text, {"EMAIL", "SMS", "MESSAGE", "NOTIFICATION", "NEWSLETTER", "MAGAZINE", "CALL"});
  };
  if (!std::all_of(c.objects.begin(), c.objects.end(), is_message)) return;
  const auto marketing = [](const Element& d) {
    return !d.negated && (d.text == "MARKETING" || d.text == "FROM.MARKETING" || d.text == "ADS");
  };
  const auto subscribed = [](const Element& o) { return name_in(o.text, {"NOTIFICATION", "NEWSLETTER", "MAGAZINE"}); };
  if (std::none_of(c.details.begin(), c.details.end(), marketing) &&
      std::none_of(c.objects.begin(), c.objects.end(), subscribed)) {
    return;
  }
  const auto plain = [](const Element& a, std::string_view name) { return a.text == name && !a.negated && !a.past; };
  const auto negated = [](const Element& a, std::string_view name) {
    return a.text == name && a.negated && !a.unable && !a.past;
  };
  const bool refused = (c.actions.size() == 1 && (plain(c.actions[0], "UNSUBSCRIBE") || plain(c.actions[0], "CANCEL") ||
                                                  negated(c.actions[0], "SEND") || negated(c.actions[0], "ARRIVE"))) ||
                       (c.actions.size() == 2 && plain(c.actions[0], "END") && plain(c.actions[1], "SEND"));
  if (!refused) return;
  c.actions.assign(1, Element{"SEND", true});
  // Advertising is marketing; "from now on" (以后) adds nothing to "don't send".
  std::erase_if(c.details, [](const Element& d) { return d.text == "AFTER" && !d.negated; });
  for (Element& d : c.details) {
    if (marketing(d)) d.text = "MARKETING";
  }
}

// What a password, a code or a number "is" asks for it, not for an amount:
// WiFi密码是多少 is "what's the wifi password".
void identifier_asked_is_no_amount(Clause& c) {
  const auto is_identifier = [](const Element& o) {
    // (Not a phone, which may be the handset: "how much is the phone?")
    return name_in(o.text, {"PASSWORD", "CODE", "USERNAME", "POSTCODE", "ACCOUNT_NUMBER", "PIN", "WIFI"});
  };
  if (c.actions.size() != 1 || c.actions[0].text != "QUERY" || c.objects.empty() ||
      !std::all_of(c.objects.begin(), c.objects.end(), is_identifier)) {
    return;
  }
  std::erase_if(c.details, [](const Element& d) { return d.text == "AMOUNT" && !d.negated; });
}

// Undoing a thing, not an act, cancels it: 帮我把这单撤了 and "undo my order"
// are "cancel my order", 撤销退款申请 is 取消退款 (undoing an act still
// reverses it: undo_to_reverse).
void undoing_a_thing_cancels_it(Clause& c) {
  if (c.actions.size() != 1 || c.actions[0].text != "UNDO" || c.actions[0].past ||
      c.objects.size() + c.entities.size() == 0) {
    return;
  }
  // Reverting a thing to another state is no cancelling: "revert my plan to the old one".
  const auto to_another = [](const Element& e) { return e.text.starts_with("TO."); };
  if (std::any_of(c.objects.begin(), c.objects.end(), to_another) ||
      std::any_of(c.details.begin(), c.details.end(), to_another)) {
    return;
  }
  c.actions[0].text = "CANCEL";
}

// Whether a clause is asked about its state: "是暂停状态吗" is "暂停了吗".
// Asked, processed is gone through: "has my payment been processed?" is "did
// my payment go through?", "is the refund done?" "has the refund gone
// through?" ("process my refund" still asks for the processing).
void state_of_an_act_asked(Clause& c) {
  if (c.mood.empty() || c.actions.empty()) return;
  const auto how = [](const Element& d) { return d.text == "METHOD"; };  // (not "how is my account handled?")
  if (c.mood == "ASK" && c.actions.size() == 1 && c.actions[0].text == "PROCESS" && !c.actions[0].negated &&
      std::none_of(c.details.begin(), c.details.end(), how)) {
    c.actions[0].text = "SUCCEED";
  }
  // (Not of what was done: "any news about the leak I reported" asks how the report stands.)
  const auto acts = [](const Element& a) { return a.text != "QUERY" && !a.negated && !a.past; };
  if (!std::all_of(c.actions.begin(), c.actions.end(), acts)) return;
  std::erase_if(c.details, [](const Element& d) { return d.text == "STATUS" && !d.negated; });
}

// Changing an appointment's time or date is rescheduling it: "change my
// appointment time", 牙医预约要改个时间 are "reschedule my appointment" (to
// which time, a detail of its own, still says).
void appointment_time_changed(Clause& c) {
  if (c.actions.size() != 1 || c.actions[0].text != "CHANGE" || c.actions[0].negated) return;
  const auto is_appointment = [](const Element& o) { return name_in(o.text, {"APPOINTMENT", "MEETING"}); };
  if (std::none_of(c.objects.begin(), c.objects.end(), is_appointment)) return;
  // (Not a time asked for: "when did you move my appointment?")
  std::erase_if(c.details,
                [](const Element& d) { return (d.text == "TIME" || d.text == "DATE") && !d.negated && !d.asked; });
}

// A flight's number names the flight: "is flight BA 117 on time" is "is
// BA117 on time", CA1831航班值机 is CA 1831值机 (two letters or a letter and a
// digit, then digits).
void flight_of_its_number(Clause& c) {
  const auto flight_number = [](const Element& e) {
    const std::string& t = e.text;
    const auto digit = [](char ch) { return ch >= '0' && ch <= '9'; };
    const auto letter = [](char ch) { return ch >= 'a' && ch <= 'z'; };
    if (e.negated || t.size() < 3 || t.size() > 6 || !letter(t[0]) || !(letter(t[1]) || digit(t[1]))) return false;
    // A date with no year (m then its month and day: 12月10号 is m1210) is no flight's number.
    if (t.size() == 5 && t[0] == 'm' && std::all_of(t.begin() + 1, t.end(), digit)) {
      const int month = (t[1] - '0') * 10 + (t[2] - '0'), day = (t[3] - '0') * 10 + (t[4] - '0');
      if (month >= 1 && month <= 12 && day >= 1 && day <= 31) return false;
    }
    return std::all_of(t.begin() + 2, t.end(), digit);
  };
  // (With nothing else in the clause, the flight stays: "my flight is UA882" says what the number is.)
  if (c.actions.empty() || std::none_of(c.entities.begin(), c.entities.end(), flight_number)) return;
  std::erase_if(c.objects, [](const Element& o) { return o.text == "FLIGHT" && !o.negated; });
}

// Deleting all of one's data or account is deleting it: 删除我所有的个人资料
// is 把我的个人信息删掉, "delete all my account data" is "delete my account
// data" (all of several orders or photos still counts them).
void all_of_ones_data_deleted(Clause& c) {
  if (c.actions.size() != 1 || c.actions[0].text != "DELETE" || c.actions[0].negated || c.objects.empty()) return;
  const auto data = [](const Element& o) {
    return !o.negated && name_in(o.text, {"PERSONAL_DATA", "DATA", "ACCOUNT", "HISTORY"});
  };
  if (!std::all_of(c.objects.begin(), c.objects.end(), data)) return;
  std::erase_if(c.details, [](const Element& d) { return d.text == "FULL" && !d.negated; });
}

// How much is left on what holds a balance asks the balance: "how much data
// do I have left" is "check my data balance", 我卡里还有多少钱 is 查一下卡的余额,
// "how many points do I have" is "my points balance", 余额是多少 is 查余额.
void amount_left_is_the_balance(Clause& c) {
  if (!c.mood.empty() || c.actions.size() != 1 || c.actions[0].text != "QUERY" || c.objects.empty() ||
      !c.entities.empty()) {
    return;
  }
  const auto holds = [](const Element& o) {
    return !o.negated && name_in(o.text, {"ACCOUNT", "CARD", "DEBIT_CARD", "CREDIT_CARD", "GIFT_CARD", "DATA", "POINTS",
                                          "WALLET", "SAVINGS", "MILES", "BALANCE"});
  };
  if (!std::all_of(c.objects.begin(), c.objects.end(), holds)) return;
  // (我的账号是多少, 卡号是多少 ask what the number is; 余额是多少 how much.)
  const auto balance = [](const Element& o) { return o.text == "BALANCE"; };
  const bool of_balance = std::any_of(c.objects.begin(), c.objects.end(), balance);
  const auto how_much = [of_balance](const Element& d) {
    return (d.text == "AMOUNT" && (!d.what_it_is || of_balance)) || d.text == "QUANTITY";
  };
  const auto left = [](const Element& d) { return d.text == "LEFT"; };
  // "my remaining data allowance" is what is left of it: the balance.
  const bool any_left = std::any_of(c.details.begin(), c.details.end(), left);
  const auto allowance = [any_left](const Element& d) { return d.text == "ALLOWANCE" && any_left; };
  const bool asks = (any_left || std::any_of(c.details.begin(), c.details.end(), how_much)) &&
                    std::all_of(c.details.begin(), c.details.end(), [&](const Element& d) {
                      return !d.negated && (how_much(d) || left(d) || allowance(d));
                    });
  if (!asks) return;
  c.details.clear();
  if (!of_balance) c.objects.push_back(Element{"BALANCE"});
}

// A question asked twice over ("tell me what's included") is asked once.
void asked_once(Clause& c) {
  const auto query = [](const Element& a) { return a.text == "QUERY" && !a.negated; };
  for (std::size_t i = 1; i < c.actions.size(); ++i) {
    if (query(c.actions[i]) && query(c.actions[i - 1]))
      c.actions.erase(c.actions.begin() + static_cast<std::ptrdiff_t>(i--));
  }
}

// Whether a flight is on time asks whether it is delayed: "is my flight on
// time" and "has my flight been delayed" (航班准点吗, 航班延误了吗) have one
// answer. (Asked for, "make sure it arrives on time" stays.)
void on_time_asks_the_delay(Clause& c) {
  const auto query = [](const Element& a) { return a.text == "QUERY" && !a.negated; };
  const bool asks = !c.states && (!c.mood.empty() || (c.actions.size() == 1 && query(c.actions[0])));
  if (!asks) return;
  for (Element& d : c.details) {
    if (d.text == "ON_TIME" && !d.negated) d.text = "DELAY";
  }
}

// Extending or putting something off until a time is extending it to that
// time: "extend my checkout until 2 pm" is "... to 2 pm", "postpone my
// delivery until Monday" "... to Monday" (a pause until June still ends then).
void until_is_to_when_put_off(Clause& c) {
  const auto puts_off = [](const Element& a) { return !a.negated && name_in(a.text, {"EXTEND", "POSTPONE"}); };
  if (std::none_of(c.actions.begin(), c.actions.end(), puts_off)) return;
  for (auto* list : {&c.objects, &c.entities, &c.details}) {
    for (Element& e : *list) {
      if (e.text.starts_with("UNTIL.")) e.text.replace(0, 6, "TO.");
    }
  }
}

// A person sent out is sent, whatever the verb: "dispatch a technician" is
// "send a technician" (dispatching an order ships it).
void person_dispatched_is_sent(Clause& c) {
  const auto person = [](const Element& o) { return name_in(o.text, {"ENGINEER", "DRIVER", "AGENT", "DOCTOR"}); };
  if (c.actions.size() != 1 || c.actions[0].text != "SHIP" ||
      std::none_of(c.objects.begin(), c.objects.end(), person) ||
      !std::all_of(c.objects.begin(), c.objects.end(),
                   [&](const Element& o) { return person(o) || o.text.starts_with("TO."); })) {
    return;
  }
  c.actions[0].text = "SEND";
}

// Undoing a change is changing back: 撤销换座 and "undo the seat change" are
// 把座位换回原来的, "change my seat back"; "back to the original" says no more
// than back (把地址改回原来的 = 撤销地址修改, "change my order back to the
// original address" = "undo the address change on my order").
void undoing_a_change_changes_back(Clause& c) {
  const auto is = [](const Element& a, std::string_view name) { return a.text == name && !a.negated && !a.past; };
  const auto find = [&](std::string_view name) {
    return std::find_if(c.actions.begin(), c.actions.end(), [&](const Element& a) { return is(a, name); });
  };
  const auto original = [](const Element& d) {
    return !d.negated && name_in(d.text, {"ORIGINAL", "TO.ORIGINAL", "PREVIOUS", "TO.PREVIOUS"});
  };
  if (c.actions.size() == 2 && find("UNDO") != c.actions.end() && find("CHANGE") != c.actions.end()) {
    c.actions.assign(1, Element{"CHANGE_BACK"});
  } else if (c.actions.size() == 1 && is(c.actions[0], "CHANGE") &&
             std::any_of(c.details.begin(), c.details.end(), [](const Element& d) {
               return d.text.starts_with("TO.ORIGINAL") || d.text == "TO.PREVIOUS";
             })) {
    c.actions[0].text = "CHANGE_BACK";
  }
  if (c.actions.size() == 1 && is(c.actions[0], "CHANGE_BACK")) std::erase_if(c.details, original);
}

// A service right after what it is names nothing more: 恢复宽带服务 is 恢复宽带,
// 取消我的彩铃业务 is 取消彩铃 (服务费, 服务密码 keep it: it comes first there).
void service_of_a_thing(Clause& c) {
  // Right after the thing it serves (not a bill's or an order's service: 账单里多了一个业务).
  for (std::size_t i = 1; i < c.objects.size(); ++i) {
    const Element& o = c.objects[i];
    const bool served_thing = !name_in(c.objects[i - 1].text, {"INVOICE", "ORDER", "ACCOUNT", "RETURN", "REFUND"});
    if (o.text == "SERVICE" && !o.negated && served_thing)
      c.objects.erase(c.objects.begin() + static_cast<std::ptrdiff_t>(i--));
  }
}

// A ticket closed, reopened or escalated is a support ticket, so the ticket
// says enough ("close support ticket SR-00912" is "close ticket SR-00912"; a
// ticket cancelled may be a train's: "cancel my support ticket" keeps it). An error on a bill, an order or a name is
// its being wrong ("my bill has an error on it" is "there's a mistake on my bill", 账单有错误 is 账单错了; an app's
// error stays an error).
void ticket_handled_is_support_and_error_is_wrong(Clause& c) {
  const auto handles = [](const Element& a) { return name_in(a.text, {"CLOSE", "REOPEN", "ESCALATE"}); };
  if (!c.actions.empty() && std::all_of(c.actions.begin(), c.actions.end(), handles)) {
    for (Element& o : c.objects) {
      if (o.text == "SUPPORT_TICKET") o.text = "TICKET";
    }
  }
  const auto written = [](const Element& o) {
    return name_in(o.text, {"INVOICE", "STATEMENT", "ORDER", "ADDRESS", "NAME", "RECEIPT"});
  };
  if (c.objects.empty() || !std::all_of(c.objects.begin(), c.objects.end(), written)) return;
  for (Element& d : c.details) {
    if (d.text == "ERROR") d.text = "WRONG";
  }
}

// A flight, a hotel, a room or a table booked is the booking: "change my
// flight booking" is "change my flight".
void booking_of_what_is_booked(Clause& c) {
  for (std::size_t i = 1; i < c.objects.size(); ++i) {
    const Element& booked = c.objects[i - 1];
    if (c.objects[i].text == "BOOKING" && c.objects[i].negated == booked.negated &&
        name_in(booked.text, {"FLIGHT", "HOTEL", "ROOM", "TABLE"})) {
      c.objects.erase(c.objects.begin() + static_cast<std::ptrdiff_t>(i));
      --i;
    }
  }
}

// Two things one request acts on are one pair whichever is named first: "the
// insurance on my car" is "my car insurance", "the heating in room 312" "room
// 312's heating", "cancel my appointment at the dentist" "my dentist
// appointment". Only where the order says nothing else: one action at most
// (with two, which thing each acts on is in the order: "return the shirt but
// keep the trousers"), no person (who does what to whom: "my son will order
// and I'll pay"), no exchange or payment (what is given and what is got), no
// sequence ("the laptop first and the charger later", 先充话费再办套餐), no
// but or if ("the wings were fine but the pizza arrived cold", "cancel my
// hotel if the flight is delayed") and nothing compared ("a credit note over
// a refund").
void things_of_one_request_unordered(Clause& c) {
  if (c.interleaved || c.sequenced || c.turns || c.actions.size() > 1 || c.objects.size() != 2) return;
  // A thing that is the verb: "file my tax return" is not "return my tax file",
  // "order a refund" not "refund an order".
  if (std::any_of(c.objects.begin(), c.objects.end(), [](const Element& o) { return o.commands; })) return;
  // What is given and what is got, unless "and" joins them ("交水费和物业费"):
  // "change my phone for a tablet", "pay my credit card with my debit card",
  // 用信用卡还花呗.
  if (!c.coordinated && !c.actions.empty() && !c.actions[0].negated &&
      name_in(verb_of(c.actions[0]), {"EXCHANGE", "CHANGE", "CONVERT", "MOVE", "TRANSFER", "APPLY", "PAY", "TOP_UP",
                                      "CHARGE", "REFUND", "SEND"})) {
    return;
  }
  const auto person = [](const Element& o) { return is_person_name(o.text); };
  if (std::any_of(c.objects.begin(), c.objects.end(), person)) return;
  if (std::any_of(c.details.begin(), c.details.end(), is_ordering)) return;
  // A return, a refund or an exchange first, as its verb would be: "a refund
  // for my order" is "refund my order". With an action too, it may be the
  // action's thing or a request of its own ("cancel the refund for my order",
  // "cancel my order and refund me"): the order stays.
  if (!c.actions.empty() && std::any_of(c.objects.begin(), c.objects.end(), is_verb_named)) return;
  const auto rank = [](const Element& o) { return std::pair(!is_verb_named(o), o.shown()); };
  if (rank(c.objects[1]) < rank(c.objects[0])) std::swap(c.objects[0], c.objects[1]);
}

// What describes one request is a set: "the date on my receipt is wrong" is
// "my receipt shows the wrong date", "my bill is way too high this month"
// "this month's bill is much higher". Not where the order may say which
// thing or which side each detail is: two actions ("return the large, keep
// the medium", a return named as a thing among them), things joined by "and"
// ("the red shirt in medium and the blue one in large"), a detail before each
// of two things ("a large pizza with small fries", "my new card replaced my
// old card"), a sequence, a negation ("to the new number, not the old one")
// or an exchange ("swap the medium shirt for a large").
void details_in_any_order(Clause& c) {
  const auto acts =
      c.actions.size() + static_cast<std::size_t>(std::count_if(c.objects.begin(), c.objects.end(), is_verb_named));
  if (c.interleaved || c.sequenced || c.coordinated || c.turns || acts > 1) return;
  const auto described = [&c](const Element& o) {
    return std::any_of(c.details.begin(), c.details.end(), [&o](const Element& d) { return d.at + 1 == o.at; });
  };
  if (std::count_if(c.objects.begin(), c.objects.end(), described) > 1) return;
  // Compared or in sequence ("my business account over my personal one"): the order is which is which.
  if (std::any_of(c.details.begin(), c.details.end(), is_ordering)) return;
  const auto negated = [](const Element& e) { return e.negated; };
  for (const auto* list : {&c.actions, &c.objects, &c.entities, &c.details}) {
    if (std::any_of(list->begin(), list->end(), negated)) return;
  }
  if (!c.actions.empty() &&
      name_in(verb_of(c.actions[0]), {"EXCHANGE", "CHANGE", "CONVERT", "MOVE", "TRANSFER", "APPLY"})) {
    return;
  }
  std::stable_sort(c.details.begin(), c.details.end(),
                   [](const Element& x, const Element& y) { return x.shown() < y.shown(); });
}

// "an aisle seat instead of a window seat" is "the aisle seat, not the
// window", "order 789, not order 456" "order 789, not 456": a thing named on
// both sides of a contrast is not what is contrasted; what tells the sides
// apart (a detail, an entity) is.
void shared_head_of_a_contrast(Clause& c) {
  const auto negated = [](const Element& e) { return e.negated; };
  if (std::none_of(c.details.begin(), c.details.end(), negated) &&
      std::none_of(c.entities.begin(), c.entities.end(), negated)) {
    return;
  }
  std::erase_if(c.objects, [&c](const Element& o) {
    return o.negated && std::any_of(c.objects.begin(), c.objects.end(),
                                    [&o](const Element& p) { return !p.negated && p.text == o.text; });
  });
}

// What one subscribes, signs up or unsubscribes to is what the request is
// about, as the thing after the verb is: "resubscribe me to the newsletter"
// is "sign me back up for the newsletter", "sign me up to the loyalty
// program" "sign me up for" it.
void subscribed_to_is_the_thing(Clause& c) {
  if (c.actions.size() != 1 || c.actions[0].past ||
      !name_in(c.actions[0].text, {"SUBSCRIBE", "RESUBSCRIBE", "UNSUBSCRIBE", "OPEN"})) {
    return;
  }
  for (Element& o : c.objects) {
    if (o.text.starts_with("TO.")) o.text.erase(0, 3);
  }
}

// An order names what was ordered: "cancel this takeaway order" is "cancel
// my takeaway", 酒店订单帮我取消 is 我要取消酒店预订, "the item missing from my
// order" "my missing item", "order a replacement remote" "replace my
// remote". Only beside other things and no id, with one action ("order a
// pizza" names both), nothing negated and no "and" ("freeze my card and order
// a new one"); not beside someone who acts ("my husband orders, I pay", "the
// restaurant cancelled my order") or a refund, a return or an exchange (先取消
// 订单再退款 is not 取消退款).
void order_names_what_was_ordered(Clause& c) {
  if (c.coordinated || c.actions.size() != 1) return;
  const auto order =
      std::find_if(c.objects.begin(), c.objects.end(), [](const Element& o) { return o.text == "ORDER"; });
  if (order == c.objects.end()) return;
  for (const auto* list : {&c.actions, &c.objects, &c.entities, &c.details}) {
    if (std::any_of(list->begin(), list->end(), is_negated)) return;
  }
  // With an id, the order is what the id numbers ("order 55120"), kept as one clause or two would say it;
  // a detail before it may say which order ("refund my last order": not "my last refund").
  if (!c.entities.empty()) return;
  if (std::any_of(c.details.begin(), c.details.end(), [&order](const Element& d) { return d.at < order->at; })) {
    return;
  }
  bool others = false;
  for (const Element& o : c.objects) {
    if (&o == &*order) continue;
    if (is_person_name(o.text) || name_in(o.text, {"RESTAURANT", "CARRIER", "EMPLOYER"}) || is_verb_named(o)) return;
    others = true;
  }
  if (!others) return;
  c.objects.erase(order);
}

// A card, a passport or a SIM missing or not found is lost ("my credit card
// is missing", 信用卡找不到了 are "I lost my credit card"); an item missing from
// an order is not.
void a_card_missing_is_lost(Clause& c) {
  if (c.objects.size() != 1 || !is_card_like(c.objects[0]) || c.objects[0].negated) return;
  for (Element& d : c.details) {
    if (name_in(d.text, {"MISSING", "NOT_FOUND"}) && !d.negated) d.text = "LOST";
  }
}

// Asked whether a thing is active is asked whether it was activated: "is my
// SIM active now?" is "has my SIM been activated?" ("my SIM is active" says so).
void active_asked_is_enabled(Clause& c) {
  if (!c.question_mark || !c.mood.empty() || c.actions.size() != 1 || c.actions[0].text != "QUERY" ||
      c.actions[0].negated || c.objects.empty()) {
    return;
  }
  const auto active = std::find_if(c.details.begin(), c.details.end(),
                                   [](const Element& d) { return d.text == "ACTIVE" && !d.negated; });
  if (active == c.details.end()) return;
  c.details.erase(active);
  c.mood = "ASK";
  c.actions[0].text = "ENABLE";
}

// "switch two-factor authentication back on" is "re-enable" it: a switch
// with back on is the resuming alone (not a change and a resumption of two
// things: "change my plan and resume my subscription"). "send me a
// replacement" is "I want a replacement": the sending says no more.
void switched_back_on_and_replacement_sent(Clause& c) {
  const auto plain = [](const Element& a, std::string_view name) { return a.text == name && !a.negated && !a.past; };
  if (c.actions.size() != 2 || c.objects.size() + c.entities.size() > 1) return;
  if (plain(c.actions[0], "CHANGE") && plain(c.actions[1], "RESUME")) {
    c.actions.erase(c.actions.begin());
  } else if (c.mood.empty() && plain(c.actions[0], "SEND") && plain(c.actions[1], "EXCHANGE") && c.actions[1].nominal) {
    // (Asked, "did you send the replacement?" is about the sending.)
    c.actions.erase(c.actions.begin());
  }
}

// An intention taken back ("I was going to cancel my order but I changed my
// mind", 本来想取消订单，不取消了) is not to do it: the intention says no more.
void intention_taken_back(Clause& c) {
  if (std::none_of(c.actions.begin(), c.actions.end(), is_negated)) return;
  std::erase_if(c.details, [](const Element& d) { return d.text == "INTENDED" && !d.negated; });
}

// A problem said is reported, not asked about: "my internet is down." is
// "report that my internet is down", not "is my internet down?", and "my
// flight has been delayed." not "has my flight been delayed?" (a complaint
// asks for a remedy, a question for the state). Only a statement (a
// question, by a word, a mood or a question mark, is no Clause::states);
// only a word for something gone wrong ("the refund status of order 7" asks).
void problem_said_is_reported(Clause& c) {
  if (!c.states || c.actions.size() != 1 || c.actions[0].text != "QUERY") return;
  const auto wrong = [](const Element& d) {
    return !d.negated &&
           name_in(d.text, {"DAMAGED",      "WRONG",        "DROPOUT",     "OUTAGE",       "MISSING",     "UNAVAILABLE",
                            "DELAY",        "STOLEN",       "LOST",        "LEAK",         "SPOILED",     "HACKED",
                            "CRASH",        "ERROR",        "OVERCHARGED", "UNAUTHORIZED", "FRAUD",       "SMELL",
                            "NOISE",        "POOR",         "BUG",         "SLOW",         "STUCK",       "DEAD",
                            "BLANK_SCREEN", "BUFFERING",    "CANNOT_OPEN", "OVERHEATING",  "WET",         "SPILLED",
                            "BURNT",        "UNDERCOOKED",  "OVERCOOKED",  "COLD",         "DIRTY",       "FAULT",
                            "PROBLEM",      "FLASHING",     "TIMEOUT",     "UNRESPONSIVE", "UNREACHABLE", "NOT_FOUND",
                            "INVALID",      "INSUFFICIENT", "BLOCKED",     "HIGH",         "WEAK"});
  };
  if (std::any_of(c.details.begin(), c.details.end(), wrong)) c.actions[0].text = "REPORT";
}

}  // namespace

void reword_clause(Clause& c) {
  again_into_action(c);
  switched_back_on_and_replacement_sent(c);
  reissue_of_a_card(c);
  new_card_is_its_replacement(c);
  new_in_replacement(c);
  stopping_for_a_time_pauses(c);
  ending_a_contract_cancels_it(c);
  cancelling_a_switch_turns_it_off(c);
  setting_up_a_switch_turns_it_on(c);
  reconnecting_restores_a_supply(c);
  billing_address_of_bills(c);
  no_more_marketing(c);
  identifier_asked_is_no_amount(c);
  undoing_a_thing_cancels_it(c);
  state_of_an_act_asked(c);
  appointment_time_changed(c);
  flight_of_its_number(c);
  all_of_ones_data_deleted(c);
  amount_left_is_the_balance(c);
  asked_once(c);
  on_time_asks_the_delay(c);
  until_is_to_when_put_off(c);
  person_dispatched_is_sent(c);
  undoing_a_change_changes_back(c);
  service_of_a_thing(c);
  ticket_handled_is_support_and_error_is_wrong(c);
  drop_carrier_verbs(c);
  money_in_its_action(c);
  account_of_its_attribute(c);
  phone_of_its_service(c);
  delivery_of_its_label(c);
  booking_of_what_is_booked(c);
  subscribed_to_is_the_thing(c);
  a_card_missing_is_lost(c);
  active_asked_is_enabled(c);
  shared_head_of_a_contrast(c);
  order_names_what_was_ordered(c);
  things_of_one_request_unordered(c);
  intention_taken_back(c);
  details_in_any_order(c);
  problem_said_is_reported(c);
}

}  // namespace clm::store_detail
