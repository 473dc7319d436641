// Test driver for torch_client_test.py: a real StoreServer in its own process, holding the NCCL
// unique id in the forms vLLM and SGLang read, for torch's own TCPStore client to talk to.
//
// Prints "port N" once listening, then answers one line per stdin line:
//   get KEY            -> "value HEX" | "missing"
//   connections        -> "connections N"
//   base64             -> "base64 TEXT" (the id as arlo offers it to vLLM: nccl_unique_id_b64)
// and exits when stdin closes. The id is byte i = (i * 37 + 11) % 256, i = 0..127.
#include <cstdio>
#include <iostream>
#include <string>

#include <fmt/format.h>

#include "weight_sync/transports/nccl/rendezvous.h"
#include "weight_sync/transports/nccl/store.h"

using namespace arlo::weight_sync::nccl;

int main() {
  auto server = StoreServer::start("127.0.0.1", 0);
  if (!server) {
    std::cerr << server.error().what() << "\n";
    return 1;
  }
  UniqueId id;
  for (std::size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = static_cast<std::byte>((i * 37 + 11) % 256);
  (*server)->set(std::string(kVllmUniqueIdKey), vllm_unique_id_pickle(id));
  (*server)->set(sglang_unique_id_key("weight_update_group"),
                 std::string(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size()));
  std::cout << "port " << (*server)->port() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.rfind("get ", 0) == 0) {
      auto v = (*server)->get(line.substr(4));
      if (!v) {
        std::cout << "missing" << std::endl;
        continue;
      }
      std::string hex;
      for (unsigned char c : *v) hex += fmt::format("{:02x}", c);
      std::cout << "value " << hex << std::endl;
    } else if (line == "base64") {
      std::cout << "base64 " << base64(id) << std::endl;
    } else if (line == "connections") {
      std::cout << "connections " << (*server)->connections() << std::endl;
    } else {
      std::cout << "unknown command: " << line << std::endl;
    }
  }
  return 0;
}
