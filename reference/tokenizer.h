#pragma once
// A character-level tokenizer for the built-in policy.
//
// Vocabulary (104 ids, fixed, so weights from any arlo run fit any arlo worker):
//   0 <pad>   padding, never generated on purpose
//   1 <bos>   start of text; prepended to text prompts
//   2 <eos>   end of text; generation stops on it (unless ignore_eos)
//   3 <unk>   any character outside the set below
//   4 <|system|>  5 <|user|>  6 <|assistant|>   chat roles (see apply_chat_template)
//   7 '\t'   8 '\n'   9..103  printable ASCII ' ' (0x20) .. '~' (0x7e), in order
//
// Text encoding never produces special tokens: "<eos>" in a prompt is five characters. Decoding
// skips special tokens unless asked to render them.
//
// Thread-safety: immutable after construction; share freely.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace arlo::reference {

class Tokenizer {
 public:
  static constexpr std::int32_t kPad = 0;
  static constexpr std::int32_t kBos = 1;
  static constexpr std::int32_t kEos = 2;
  static constexpr std::int32_t kUnk = 3;
  static constexpr std::int32_t kSystem = 4;
  static constexpr std::int32_t kUser = 5;
  static constexpr std::int32_t kAssistant = 6;
  static constexpr std::int32_t kVocabSize = 104;

  // Characters to ids; no <bos>.
  std::vector<std::int32_t> encode(std::string_view text) const;
  // <bos> followed by encode(text): what a text prompt becomes.
  std::vector<std::int32_t> encode_prompt(std::string_view text) const;
  // Ids to text. Special tokens are skipped, or rendered as "<eos>" etc. when render_special.
  std::string decode(const std::vector<std::int32_t>& ids, bool render_special = false) const;
  // The text of one id ("" for a skipped special token, or its name when render_special).
  std::string piece(std::int32_t id, bool render_special = false) const;

  bool is_special(std::int32_t id) const { return id >= 0 && id < 7; }
  bool valid(std::int32_t id) const { return id >= 0 && id < kVocabSize; }
  std::int32_t vocab_size() const { return kVocabSize; }

  // Chat template: <bos>, then for each message its role token, its content and '\n', then
  // <|assistant|> so the model continues as the assistant. Roles: system, user, assistant;
  // returns nullopt for another role.
  struct Message {
    std::string role;
    std::string content;
  };
  std::optional<std::vector<std::int32_t>> apply_chat_template(const std::vector<Message>& messages) const;
};

}  // namespace arlo::reference
