#include "reference/tokenizer.h"

namespace arlo::reference {
namespace {

constexpr const char* kSpecialNames[7] = {"<pad>",      "<bos>",    "<eos>",        "<unk>",
                                          "<|system|>", "<|user|>", "<|assistant|>"};

std::int32_t char_to_id(unsigned char c) {
  if (c == '\t') return 7;
  if (c == '\n') return 8;
  if (c >= 0x20 && c <= 0x7e) return 9 + (c - 0x20);
  return Tokenizer::kUnk;
}

}  // namespace

std::vector<std::int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(char_to_id(static_cast<unsigned char>(c)));
  return ids;
}

std::vector<std::int32_t> Tokenizer::encode_prompt(std::string_view text) const {
  std::vector<std::int32_t> ids;
  ids.reserve(text.size() + 1);
  ids.push_back(kBos);
  for (char c : text) ids.push_back(char_to_id(static_cast<unsigned char>(c)));
  return ids;
}

std::string Tokenizer::piece(std::int32_t id, bool render_special) const {
  if (id < 0 || id >= kVocabSize) return render_special ? "<unk>" : "";
  if (id < 7) return render_special ? kSpecialNames[id] : "";
  if (id == 7) return "\t";
  if (id == 8) return "\n";
  return std::string(1, static_cast<char>(0x20 + (id - 9)));
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids, bool render_special) const {
  std::string out;
  out.reserve(ids.size());
  for (std::int32_t id : ids) out += piece(id, render_special);
  return out;
}

std::optional<std::vector<std::int32_t>> Tokenizer::apply_chat_template(const std::vector<Message>& messages) const {
  std::vector<std::int32_t> ids{kBos};
  for (const Message& m : messages) {
    if (m.role == "system") {
      ids.push_back(kSystem);
    } else if (m.role == "user") {
      ids.push_back(kUser);
    } else if (m.role == "assistant") {
      ids.push_back(kAssistant);
    } else {
      return std::nullopt;
    }
    auto content = encode(m.content);
    ids.insert(ids.end(), content.begin(), content.end());
    ids.push_back(8);  // '\n'
  }
  ids.push_back(kAssistant);
  return ids;
}

}  // namespace arlo::reference
