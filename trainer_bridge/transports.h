#pragma once
// Transport constructors behind BridgeServer::create and bridge::connect. Internal.
#include <boost/asio/io_context.hpp>

#include <memory>

#include "trainer_bridge/bridge.h"

namespace arlo::bridge::internal {

Result<std::unique_ptr<BridgeServer>> make_dir_server(boost::asio::io_context& io, ServerOptions options);
Result<std::unique_ptr<BridgeClient>> make_dir_client(const ClientOptions& options);
Result<std::unique_ptr<BridgeServer>> make_socket_server(boost::asio::io_context& io, ServerOptions options);
Result<std::unique_ptr<BridgeClient>> make_socket_client(const ClientOptions& options);

}  // namespace arlo::bridge::internal
