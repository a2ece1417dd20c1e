// Objects in S3-compatible storage, for s3:// datasets (docs/data.md, "Object storage"): an s3://
// URL split into bucket and key, and a client that gets, puts, lists and removes objects over
// HTTP(S) through Debian's libcurl, which signs each request with AWS Signature Version 4.
//
// Credentials, endpoint and region come from the variables litdata and boto3 read:
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (optional), AWS_ENDPOINT_URL_S3 or
// AWS_ENDPOINT_URL (default: AWS, https://s3.REGION.amazonaws.com), AWS_REGION or
// AWS_DEFAULT_REGION (default us-east-1). Requests use path-style addressing (endpoint/bucket/key),
// which S3-compatible servers expect. A request that fails to connect or gets a 5xx or 429 answer
// is retried with exponential backoff (kAttempts tries over about 6 s); then, and for any other
// error answer, a RuntimeError names the object, the HTTP status and the server's code and message.
// Thread-safe: every call has its own connection.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lightning::fabric::storage {

/// An object's address: s3://bucket/key (key may be empty or a prefix).
struct S3Url {
  std::string bucket;
  std::string key;
  /// Whether text names object storage (starts with s3://).
  static bool is_s3(std::string_view text);
  /// ValueError naming `who`, the text and the choices when text starts with a URL scheme other
  /// than s3:// (gs://, http://, ...), which would otherwise be taken for a local path.
  static void refuse_other_schemes(std::string_view text, const std::string& who);
  /// Splits s3://bucket/key. ValueError naming `who` and the text for one without a bucket.
  static S3Url parse(std::string_view text, const std::string& who);
  /// s3://bucket/key
  std::string str() const;
  /// This prefix's object `name` (key + "/" + name, or name for an empty key).
  S3Url child(const std::string& name) const;
};

struct S3Object {
  std::string key;
  int64_t size = 0;
};

class S3Client {
 public:
  static constexpr int kAttempts = 6;
  /// From the environment (see above). ValueError naming `who` when the access key or secret is
  /// missing, or when this build has no libcurl.
  static S3Client from_environment(const std::string& who);
  /// Whether this build can reach object storage (libcurl was found when it was built).
  static bool available();

  /// The whole object. RuntimeError naming it when it is missing or cannot be read.
  std::string get(const S3Url& url) const;
  /// The object written to `path` through a temporary file renamed into place (never a torn
  /// file at `path`); returns its size.
  int64_t get_to_file(const S3Url& url, const std::filesystem::path& path) const;
  /// Writes the object (replacing one of that key).
  void put(const S3Url& url, std::string_view bytes) const;
  /// The objects whose keys start with url.key, in key order.
  std::vector<S3Object> list(const S3Url& prefix) const;
  /// The objects under the folder `folder` (keys starting with folder.key + "/"; the whole bucket
  /// for an empty key), by name relative to it, with their sizes.
  std::map<std::string, int64_t> list_folder(const S3Url& folder) const;
  void remove(const S3Url& url) const;
  const std::string& endpoint() const { return endpoint_; }

 private:
  std::string endpoint_;  // scheme://host[:port], no trailing slash
  std::string region_;
  std::string access_key_, secret_key_, session_token_;
};

}  // namespace lightning::fabric::storage
