// JPEG (libjpeg-turbo) and PNG (libpng) for LitData's image leaves, decoded as torchvision's
// decode_image(mode=RGB) does: 8-bit RGB, grey expanded to three channels, alpha dropped.
#include "lightning/fabric/data/litdata_format.h"

#include <ATen/ATen.h>

#include <csetjmp>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#if LF_HAVE_IMAGE_CODECS
#include <jpeglib.h>
#include <png.h>
#endif

namespace lightning::fabric::data_detail {

#if LF_HAVE_IMAGE_CODECS
namespace {

struct JpegError {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};
void jpeg_error_exit(j_common_ptr info) {
  auto* error = reinterpret_cast<JpegError*>(info->err);
  info->err->format_message(info, error->message);
  std::longjmp(error->jump, 1);
}
void jpeg_silence(j_common_ptr, int) {}

// setjmp frames hold no C++ objects: what outlives a longjmp lives in the caller's frame.
bool jpeg_decode_into(const uint8_t* data, size_t size, at::Tensor* out, JpegError* error_out) {
  jpeg_decompress_struct info{};
  JpegError& error = *error_out;
  info.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = jpeg_error_exit;
  error.manager.emit_message = jpeg_silence;
  if (setjmp(error.jump)) {
    jpeg_destroy_decompress(&info);
    return false;
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, data, static_cast<unsigned long>(size));
  jpeg_read_header(&info, TRUE);
  info.out_color_space = JCS_RGB;
  jpeg_start_decompress(&info);
  try {  // a damaged header can ask for more memory than there is
    *out = at::empty({static_cast<int64_t>(info.output_height), static_cast<int64_t>(info.output_width), 3}, at::kByte);
  } catch (...) {
    jpeg_destroy_decompress(&info);
    throw;
  }
  uint8_t* pixels = out->data_ptr<uint8_t>();
  const size_t stride = size_t{info.output_width} * 3;
  while (info.output_scanline < info.output_height) {
    JSAMPROW row = pixels + size_t{info.output_scanline} * stride;
    jpeg_read_scanlines(&info, &row, 1);
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  return true;
}

// The EXIF orientation (1 to 8) of a JPEG's APP1 block, 1 without one: the markers before the
// image data are scanned as LitData does, then the TIFF header and its first directory's 0x0112.
int exif_orientation(const uint8_t* data, size_t size) {
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) return 1;
  size_t at = 2;
  while (at + 4 <= size && data[at] == 0xFF) {
    const uint8_t marker = data[at + 1];
    if (marker == 0xDA) return 1;  // start of scan: no EXIF before the image data
    if (marker == 0xD8 || marker == 0xD9 || (marker >= 0xD0 && marker <= 0xD7)) {
      at += 2;
      continue;
    }
    const size_t length = (size_t{data[at + 2]} << 8) | data[at + 3];
    if (marker == 0xE1 && at + 10 <= size && std::memcmp(data + at + 4, "Exif\0\0", 6) == 0) {
      const uint8_t* tiff = data + at + 10;
      const size_t tiff_size = std::min(size - (at + 10), length >= 8 ? length - 8 : 0);
      if (tiff_size < 8) return 1;
      const bool little = tiff[0] == 'I' && tiff[1] == 'I';
      if (!little && !(tiff[0] == 'M' && tiff[1] == 'M')) return 1;
      auto u16 = [&](size_t o) { return little ? uint32_t(tiff[o]) | uint32_t(tiff[o + 1]) << 8 : uint32_t(tiff[o]) << 8 | tiff[o + 1]; };
      auto u32 = [&](size_t o) { return little ? u16(o) | u16(o + 2) << 16 : u16(o) << 16 | u16(o + 2); };
      const size_t directory = u32(4);
      if (directory + 2 > tiff_size) return 1;
      const size_t entries = u16(directory);
      for (size_t e = 0; e < entries && directory + 2 + 12 * (e + 1) <= tiff_size; ++e) {
        const size_t entry = directory + 2 + 12 * e;
        if (u16(entry) == 0x0112 && u16(entry + 2) == 3) {  // Orientation, SHORT
          const int value = static_cast<int>(u16(entry + 8));
          return value >= 1 && value <= 8 ? value : 1;
        }
      }
      return 1;
    }
    at += 2 + length;
  }
  return 1;
}

// An [H, W, C] image turned upright as PIL's ImageOps.exif_transpose turns it.
at::Tensor apply_orientation(const at::Tensor& image, int orientation) {
  switch (orientation) {
    case 2: return image.flip({1});                       // mirrored left-right
    case 3: return image.flip({0, 1});                    // rotated 180
    case 4: return image.flip({0});                       // mirrored top-bottom
    case 5: return image.transpose(0, 1);                 // transposed
    case 6: return image.transpose(0, 1).flip({1});       // rotated 90 clockwise to be upright
    case 7: return image.transpose(0, 1).flip({0, 1});    // transversed
    case 8: return image.transpose(0, 1).flip({0});       // rotated 90 counter-clockwise to be upright
    default: return image;
  }
}

at::Tensor decode_jpeg(const uint8_t* data, size_t size) {
  at::Tensor image;
  JpegError error{};
  if (!jpeg_decode_into(data, size, &image, &error))
    throw std::runtime_error(std::string("JPEG data cannot be decoded: ") + error.message);
  return apply_orientation(image, exif_orientation(data, size)).permute({2, 0, 1}).contiguous();
}

struct PngReader {
  const uint8_t* data;
  size_t size;
  size_t offset;
};
void png_read_memory(png_structp png, png_bytep out, png_size_t length) {
  auto* reader = static_cast<PngReader*>(png_get_io_ptr(png));
  if (reader->offset + length > reader->size) png_error(png, "truncated PNG data");
  std::memcpy(out, reader->data + reader->offset, length);
  reader->offset += length;
}
void png_warning_silent(png_structp, png_const_charp) {}

bool png_decode_into(png_structp png, png_infop info, PngReader* reader, at::Tensor* out, std::vector<png_bytep>* rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_read_fn(png, reader, png_read_memory);
  png_read_info(png, info);
  const int color = png_get_color_type(png, info);
  png_set_expand(png);  // palette -> RGB, grey < 8 bits -> 8 bits, tRNS -> alpha
  png_set_strip_16(png);
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_strip_alpha(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const png_uint_32 width = png_get_image_width(png, info), height = png_get_image_height(png, info);
  if (png_get_rowbytes(png, info) != size_t{width} * 3) png_error(png, "unexpected row layout");
  *out = at::empty({static_cast<int64_t>(height), static_cast<int64_t>(width), 3}, at::kByte);
  rows->resize(height);
  for (png_uint_32 y = 0; y < height; ++y) (*rows)[y] = out->data_ptr<uint8_t>() + size_t{y} * width * 3;
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  return true;
}

at::Tensor decode_png(const uint8_t* data, size_t size) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, png_warning_silent);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info) {
    png_destroy_read_struct(&png, &info, nullptr);
    throw std::runtime_error("PNG decoder could not start (out of memory)");
  }
  PngReader reader{data, size, 0};
  at::Tensor image;
  std::vector<png_bytep> rows;
  bool decoded = false;
  try {
    decoded = png_decode_into(png, info, &reader, &image, &rows);
  } catch (...) {  // the image's allocation failed
    png_destroy_read_struct(&png, &info, nullptr);
    throw;
  }
  png_destroy_read_struct(&png, &info, nullptr);
  if (!decoded) throw std::runtime_error("PNG data cannot be decoded (damaged or truncated)");
  return image.permute({2, 0, 1}).contiguous();
}

}  // namespace

at::Tensor decode_image_rgb(const uint8_t* data, size_t size) {
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return decode_jpeg(data, size);
  static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (size >= 8 && std::memcmp(data, png_magic, 8) == 0) return decode_png(data, size);
  throw std::runtime_error("image data is neither JPEG nor PNG (other image formats are not decoded here)");
}

namespace {
bool jpeg_encode_into(const at::Tensor& pixels, bool grey, int quality, unsigned char** buffer, unsigned long* length,
                      JpegError* error_out) {
  jpeg_compress_struct info{};
  JpegError& error = *error_out;
  info.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = jpeg_error_exit;
  if (setjmp(error.jump)) {
    jpeg_destroy_compress(&info);
    return false;
  }
  jpeg_create_compress(&info);
  jpeg_mem_dest(&info, buffer, length);
  info.image_width = static_cast<JDIMENSION>(pixels.size(1));
  info.image_height = static_cast<JDIMENSION>(pixels.size(0));
  info.input_components = grey ? 1 : 3;
  info.in_color_space = grey ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, quality, TRUE);
  jpeg_start_compress(&info, TRUE);
  const size_t stride = size_t{info.image_width} * info.input_components;
  uint8_t* base = static_cast<uint8_t*>(pixels.data_ptr());
  while (info.next_scanline < info.image_height) {
    JSAMPROW row = base + size_t{info.next_scanline} * stride;
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  jpeg_destroy_compress(&info);
  return true;
}
}  // namespace

std::string encode_jpeg(const at::Tensor& image, int quality) {
  at::Tensor pixels = image;
  if (pixels.scalar_type() != at::kByte || (pixels.dim() != 2 && !(pixels.dim() == 3 && (pixels.size(0) == 3 || pixels.size(0) == 1))))
    throw std::runtime_error("a JPEG image must be a uint8 tensor [3, H, W], [1, H, W] or [H, W]");
  if (pixels.dim() == 3 && pixels.size(0) == 1) pixels = pixels[0];
  const bool grey = pixels.dim() == 2;
  pixels = grey ? pixels.contiguous() : pixels.permute({1, 2, 0}).contiguous();
  unsigned char* buffer = nullptr;
  unsigned long length = 0;
  JpegError error{};
  const bool encoded = jpeg_encode_into(pixels, grey, quality, &buffer, &length, &error);
  std::string out = encoded ? std::string(reinterpret_cast<const char*>(buffer), length) : std::string();
  std::free(buffer);
  if (!encoded) throw std::runtime_error(std::string("JPEG encoding failed: ") + error.message);
  return out;
}

#else  // built without libjpeg and libpng

at::Tensor decode_image_rgb(const uint8_t*, size_t) {
  throw std::runtime_error("this build of lightning_fabric has no JPEG/PNG decoder (libjpeg-turbo and libpng were not "
                           "found when it was built; Debian: libjpeg62-turbo-dev libpng-dev)");
}
std::string encode_jpeg(const at::Tensor&, int) {
  throw std::runtime_error("this build of lightning_fabric has no JPEG encoder (libjpeg-turbo was not found when it "
                           "was built; Debian: libjpeg62-turbo-dev)");
}

#endif

}  // namespace lightning::fabric::data_detail
