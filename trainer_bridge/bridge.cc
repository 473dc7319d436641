#include "trainer_bridge/bridge.h"

#include <fmt/format.h>

#include "trainer_bridge/transports.h"

namespace arlo::bridge {

Result<std::unique_ptr<BridgeServer>> BridgeServer::create(boost::asio::io_context& io, ServerOptions options) {
  if (options.transport == "dir") return internal::make_dir_server(io, std::move(options));
  if (options.transport == "socket") return internal::make_socket_server(io, std::move(options));
  return make_error(ErrorCode::kInvalidArgument,
                    fmt::format("trainer bridge: unknown transport '{}' (use dir or socket)", options.transport));
}

Result<std::unique_ptr<BridgeClient>> connect(const ClientOptions& options) {
  if (options.transport == "dir") return internal::make_dir_client(options);
  if (options.transport == "socket") return internal::make_socket_client(options);
  return make_error(ErrorCode::kInvalidArgument,
                    fmt::format("trainer bridge: unknown transport '{}' (use dir or socket)", options.transport));
}

}  // namespace arlo::bridge
