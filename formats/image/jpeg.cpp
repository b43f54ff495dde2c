// JPEG through libjpeg(-turbo). libjpeg's fatal-error handler must not return, so ours
// formats the message and longjmps back to the setjmp of the step that was running. The step
// functions below are written like C: they own nothing with a destructor, so the jump skips no
// cleanup; the structs and the pixel memory belong to the C++ callers, which throw once a step
// reports failure.
#include <cstddef>
#include <cstdio>  // before jpeglib.h, which uses FILE and size_t without including them

#include <jerror.h>
#include <jpeglib.h>

#include <algorithm>
#include <csetjmp>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "core/error.h"
#include "formats/image/codecs.h"
#include "formats/image/exif.h"

namespace klein::codecs {

namespace {

// A progressive file can hold any number of scans, each a pass over the whole coefficient
// buffer; a few kilobytes of tiny scans would keep the decoder busy for minutes. Real
// encoders write about ten.
constexpr int kMaxScans = 1000;

// A COM marker holds at most 65533 bytes of text.
constexpr size_t kMaxComment = 65533;

struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jump_with(j_common_ptr cinfo, const char* text) {
  auto* errors = static_cast<JpegErrors*>(cinfo->client_data);
  if (text)
    std::snprintf(errors->message, sizeof errors->message, "%s", text);
  else
    (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

void on_jpeg_error(j_common_ptr cinfo) { jump_with(cinfo, nullptr); }

// libjpeg only warns when the data ends before the end marker and pads the image with grey; a
// truncated file is an error for us, as for PIL. Other warnings (stray bytes between
// markers...) are ignored, as PIL ignores them.
void on_jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) jump_with(cinfo, "file is truncated");
}

void on_jpeg_output(j_common_ptr) {}  // never print

void on_jpeg_progress(j_common_ptr cinfo) {
  if (!cinfo->is_decompressor) return;
  if (reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number > kMaxScans)
    jump_with(cinfo, "too many progressive scans (corrupt or malicious file)");
}

void install_error_handlers(jpeg_error_mgr& mgr) {
  jpeg_std_error(&mgr);
  mgr.error_exit = on_jpeg_error;
  mgr.emit_message = on_jpeg_message;
  mgr.output_message = on_jpeg_output;
}

struct JpegDecoder {
  jpeg_decompress_struct cinfo{};
  JpegErrors errors{};
  jpeg_progress_mgr progress{};

  JpegDecoder() {
    install_error_handlers(errors.mgr);
    cinfo.err = &errors.mgr;
    cinfo.client_data = &errors;
    progress.progress_monitor = on_jpeg_progress;
  }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
  // Safe also when creation never happened: the struct is zeroed, so there is nothing to free.
  ~JpegDecoder() { jpeg_destroy_decompress(&cinfo); }
};

struct JpegEncoder {
  jpeg_compress_struct cinfo{};
  JpegErrors errors{};

  JpegEncoder() {
    install_error_handlers(errors.mgr);
    cinfo.err = &errors.mgr;
    cinfo.client_data = &errors;
  }
  JpegEncoder(const JpegEncoder&) = delete;
  JpegEncoder& operator=(const JpegEncoder&) = delete;
  ~JpegEncoder() { jpeg_destroy_compress(&cinfo); }
};

// Markers up to the first scan: size, colour space, comments.
bool read_jpeg_header(JpegDecoder& d, const unsigned char* data, size_t size) {
  if (setjmp(d.errors.jump)) return false;
  jpeg_create_decompress(&d.cinfo);
  d.cinfo.progress = &d.progress;
  jpeg_mem_src(&d.cinfo, data, static_cast<unsigned long>(size));
  jpeg_save_markers(&d.cinfo, JPEG_COM, 0xffff);
  jpeg_save_markers(&d.cinfo, JPEG_APP0 + 1, 0xffff);  // EXIF (orientation)
  jpeg_read_header(&d.cinfo, TRUE);
  return true;
}

bool is_four_component(const jpeg_decompress_struct& cinfo) {
  return cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
}

// One channel of a four-component pixel as Pillow reads it, which the official pipeline's
// convert("RGB") follows: every component inverted first (Pillow's "CMYK;I" raw mode, used
// for all such JPEGs whatever their Adobe marker says), then (255 - k) - c·(255 - k)/255 with
// Pillow's rounded division by 255 and clipping. In libjpeg's raw values: 255 - k is raw k.
uint8_t cmyk_to_rgb_channel(JSAMPLE raw_c, JSAMPLE raw_k) {
  const int c = 255 - int(raw_c), nk = int(raw_k);
  const int t = c * nk + 128;
  return uint8_t(std::clamp(nk - (((t >> 8) + t) >> 8), 0, 255));
}

// Decodes every scanline as RGB into `rows` (libjpeg's defaults: accurate integer IDCT and
// smooth chroma upsampling, the settings PIL uses). CMYK and YCCK files are decoded to CMYK
// (libjpeg converts YCCK) a row at a time into `cmyk_row` (4 x width samples) and converted.
bool read_jpeg_pixels(JpegDecoder& d, JSAMPARRAY rows, JSAMPLE* cmyk_row) {
  if (setjmp(d.errors.jump)) return false;
  const bool cmyk = is_four_component(d.cinfo);
  d.cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(&d.cinfo);
  // `rows` was sized from the header: anything else would write out of bounds.
  if (d.cinfo.output_components != (cmyk ? 4 : 3) || d.cinfo.output_width != d.cinfo.image_width ||
      d.cinfo.output_height != d.cinfo.image_height)
    jump_with(reinterpret_cast<j_common_ptr>(&d.cinfo),
              "decoder output is not RGB or CMYK of the header's size");
  while (d.cinfo.output_scanline < d.cinfo.output_height) {
    const JDIMENSION done = d.cinfo.output_scanline;
    if (!cmyk) {
      jpeg_read_scanlines(&d.cinfo, rows + done, d.cinfo.output_height - done);
      continue;
    }
    JSAMPROW in = cmyk_row;
    if (jpeg_read_scanlines(&d.cinfo, &in, 1) != 1) continue;
    JSAMPLE* out = rows[done];
    for (JDIMENSION x = 0; x < d.cinfo.output_width; ++x) {
      const JSAMPLE* p = cmyk_row + 4 * x;
      for (int ch = 0; ch < 3; ++ch) out[3 * x + JDIMENSION(ch)] = cmyk_to_rgb_channel(p[ch], p[3]);
    }
  }
  jpeg_finish_decompress(&d.cinfo);
  return true;
}

// The header of an XMP APP1 segment (the XMP specification, part 3).
constexpr char kXmpHeader[] = "http://ns.adobe.com/xap/1.0/";  // written with its NUL
constexpr size_t kMaxXmp = 65533 - sizeof kXmpHeader;

bool write_jpeg_file(JpegEncoder& e, std::FILE* out, const Image& image, int quality,
                     const std::string* comments, size_t num_comments, const std::string* xmp) {
  if (setjmp(e.errors.jump)) return false;
  jpeg_create_compress(&e.cinfo);
  jpeg_stdio_dest(&e.cinfo, out);
  e.cinfo.image_width = JDIMENSION(image.width);
  e.cinfo.image_height = JDIMENSION(image.height);
  e.cinfo.input_components = 3;
  e.cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&e.cinfo);
  jpeg_set_quality(&e.cinfo, quality, TRUE);
  // Chroma at full resolution (4:4:4, not libjpeg's default 4:2:0): the invisible mark lives
  // in U (formats/image/watermark.h) and does not survive halved chroma with the decoder's
  // interpolation (measured in docs/WATERMARK.md).
  for (int c = 0; c < e.cinfo.num_components; ++c)
    e.cinfo.comp_info[c].h_samp_factor = e.cinfo.comp_info[c].v_samp_factor = 1;
  jpeg_start_compress(&e.cinfo, TRUE);
  if (xmp) {
    std::string segment(kXmpHeader, sizeof kXmpHeader);
    segment += *xmp;
    jpeg_write_marker(&e.cinfo, JPEG_APP0 + 1, reinterpret_cast<const JOCTET*>(segment.data()),
                      static_cast<unsigned>(segment.size()));
  }
  for (size_t i = 0; i < num_comments; ++i)
    jpeg_write_marker(&e.cinfo, JPEG_COM, reinterpret_cast<const JOCTET*>(comments[i].data()),
                      static_cast<unsigned>(comments[i].size()));
  while (e.cinfo.next_scanline < e.cinfo.image_height) {
    // libjpeg only reads the row.
    JSAMPROW row = const_cast<JSAMPROW>(image.row(int(e.cinfo.next_scanline)));
    jpeg_write_scanlines(&e.cinfo, &row, 1);
  }
  jpeg_finish_compress(&e.cinfo);
  return true;
}

void check_color_space(const std::string& name, const jpeg_decompress_struct& cinfo) {
  switch (cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
    case JCS_CMYK:  // converted as Pillow does (cmyk_to_rgb_channel)
    case JCS_YCCK: return;
    default:
      fail(name, ": JPEG with ", cinfo.num_components,
           " components in an unknown colour space is not supported");
  }
}

// "key=value" comments (as save_jpeg writes them) become pairs; any other comment is kept
// whole under the key "comment".
void append_comments(const jpeg_decompress_struct& cinfo, ImageMetadata& out) {
  for (jpeg_saved_marker_ptr m = cinfo.marker_list; m; m = m->next) {
    if (m->marker == JPEG_APP0 + 1 && m->data_length >= sizeof kXmpHeader &&
        std::memcmp(m->data, kXmpHeader, sizeof kXmpHeader) == 0) {
      out.emplace_back(kXmpKey, std::string(reinterpret_cast<const char*>(m->data) +
                                                sizeof kXmpHeader,
                                            m->data_length - sizeof kXmpHeader));
      continue;
    }
    if (m->marker != JPEG_COM) continue;
    std::string text(reinterpret_cast<const char*>(m->data), m->data_length);
    if (!is_valid_utf8(text)) text = latin1_to_utf8(text);  // older tools wrote Latin-1
    const size_t eq = text.find('=');
    if (eq != std::string::npos && is_metadata_key(std::string_view(text).substr(0, eq)))
      out.emplace_back(text.substr(0, eq), text.substr(eq + 1));
    else
      out.emplace_back("comment", std::move(text));
  }
}

// The EXIF orientation of the first APP1 segment that holds EXIF; 1 without one.
int orientation_of(const jpeg_decompress_struct& cinfo) {
  static const char kExif[6] = {'E', 'x', 'i', 'f', 0, 0};
  for (jpeg_saved_marker_ptr m = cinfo.marker_list; m; m = m->next) {
    if (m->marker != JPEG_APP0 + 1 || m->data_length < sizeof kExif ||
        std::memcmp(m->data, kExif, sizeof kExif) != 0)
      continue;
    return exif_orientation(std::as_bytes(std::span(m->data + sizeof kExif,
                                                    m->data_length - sizeof kExif)));
  }
  return 1;
}

}  // namespace

Image decode_jpeg(std::span<const std::byte> data, const std::string& name,
                  const ImageLimits& limits, ImageMetadata* metadata) {
  JpegDecoder d;
  if (!read_jpeg_header(d, reinterpret_cast<const unsigned char*>(data.data()), data.size()))
    fail(name, ": cannot read JPEG: ", d.errors.message);
  check_image_size(name, d.cinfo.image_width, d.cinfo.image_height, limits);
  check_color_space(name, d.cinfo);
  // Saved markers live until the decoder finishes, so the comments are taken now.
  ImageMetadata comments;
  if (metadata) append_comments(d.cinfo, comments);
  const int orientation = orientation_of(d.cinfo);

  Image image(int(d.cinfo.image_width), int(d.cinfo.image_height));
  std::vector<JSAMPROW> rows(size_t(image.height));
  for (int y = 0; y < image.height; ++y) rows[size_t(y)] = image.row(y);
  std::vector<JSAMPLE> cmyk_row(is_four_component(d.cinfo) ? 4 * size_t(image.width) : 0);
  if (!read_jpeg_pixels(d, rows.data(), cmyk_row.data()))
    fail(name, ": cannot read JPEG: ", d.errors.message);

  if (metadata) metadata->insert(metadata->end(), comments.begin(), comments.end());
  return apply_orientation(std::move(image), orientation);
}

void encode_jpeg(std::FILE* out, const std::string& name, const Image& image, int quality,
                 const ImageMetadata& metadata) {
  check(image.width <= JPEG_MAX_DIMENSION && image.height <= JPEG_MAX_DIMENSION, "cannot write ",
        name, ": ", image.width, "x", image.height, " is larger than JPEG allows (",
        JPEG_MAX_DIMENSION, " per side)");
  std::vector<std::string> comments;
  const std::string* xmp = nullptr;
  for (const auto& [key, value] : metadata) {
    if (key == kXmpKey) {
      check(value.size() <= kMaxXmp, "cannot write ", name, ": the XMP packet (", value.size(),
            " bytes) is longer than a JPEG segment can hold (", kMaxXmp, " bytes)");
      xmp = &value;
      continue;
    }
    comments.push_back(key + "=" + value);
    check(comments.back().size() <= kMaxComment, "cannot write ", name, ": metadata '", key,
          "' is longer than a JPEG comment can hold (", kMaxComment, " bytes)");
  }
  JpegEncoder e;
  if (!write_jpeg_file(e, out, image, quality, comments.data(), comments.size(), xmp))
    fail("cannot write ", name, ": ", e.errors.message);
}

}  // namespace klein::codecs
