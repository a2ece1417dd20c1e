// zstd for LitData's compressed chunks (libzstd from Debian, when the build found it).
#include "lightning/fabric/data/litdata_format.h"

#include <stdexcept>

#if LF_HAVE_ZSTD
#include <zstd.h>
#endif

namespace lightning::fabric::data_detail {

#if LF_HAVE_ZSTD

bool zstd_available() { return true; }

std::string zstd_inflate(const uint8_t* data, size_t size, size_t expected_size) {
  if (expected_size == 0) {
    const unsigned long long content = ZSTD_getFrameContentSize(data, size);
    if (content == ZSTD_CONTENTSIZE_ERROR) throw std::runtime_error("not zstd data (no zstd frame header)");
    if (content != ZSTD_CONTENTSIZE_UNKNOWN) expected_size = static_cast<size_t>(content);
  }
  std::string out(expected_size ? expected_size : size * 4 + 64, '\0');
  ZSTD_DStream* stream = ZSTD_createDStream();
  if (!stream) throw std::runtime_error("zstd could not start (out of memory)");
  ZSTD_inBuffer in{data, size, 0};
  size_t written = 0;
  for (;;) {
    ZSTD_outBuffer target{out.data() + written, out.size() - written, 0};
    const size_t status = ZSTD_decompressStream(stream, &target, &in);
    written += target.pos;
    if (ZSTD_isError(status)) {
      ZSTD_freeDStream(stream);
      throw std::runtime_error(std::string("zstd data is damaged: ") + ZSTD_getErrorName(status));
    }
    if (status == 0 && in.pos == in.size) break;  // every frame read
    if (in.pos == in.size && target.pos < target.size) {  // the input ended inside a frame
      ZSTD_freeDStream(stream);
      throw std::runtime_error("zstd data is truncated");
    }
    if (written == out.size()) out.resize(out.size() * 2);
  }
  ZSTD_freeDStream(stream);
  out.resize(written);
  return out;
}

std::string zstd_deflate(const uint8_t* data, size_t size, int level) {
  std::string out(ZSTD_compressBound(size), '\0');
  const size_t written = ZSTD_compress(out.data(), out.size(), data, size, level);
  if (ZSTD_isError(written)) throw std::runtime_error(std::string("zstd compression failed: ") + ZSTD_getErrorName(written));
  out.resize(written);
  return out;
}

#else  // built without libzstd

namespace {
[[noreturn]] void no_zstd() {
  throw std::runtime_error("this build of lightning_fabric has no zstd (libzstd was not found when it was built; "
                           "Debian: libzstd-dev)");
}
}  // namespace

bool zstd_available() { return false; }
std::string zstd_inflate(const uint8_t*, size_t, size_t) { no_zstd(); }
std::string zstd_deflate(const uint8_t*, size_t, int) { no_zstd(); }

#endif

}  // namespace lightning::fabric::data_detail
