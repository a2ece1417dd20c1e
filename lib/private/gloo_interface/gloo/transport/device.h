// Stand-in for gloo/transport/device.h (README.md): c10d only holds these through smart pointers.
#pragma once

namespace gloo::transport {
class Device;
class UnboundBuffer;
}  // namespace gloo::transport
