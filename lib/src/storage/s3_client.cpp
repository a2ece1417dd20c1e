#include "lightning/fabric/storage/s3_client.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <unistd.h>

#include "lightning/fabric/errors.h"

#ifdef LF_HAVE_CURL
#include <curl/curl.h>
#endif

namespace lightning::fabric::storage {
namespace fs = std::filesystem;

bool S3Url::is_s3(std::string_view text) { return text.rfind("s3://", 0) == 0; }

void S3Url::refuse_other_schemes(std::string_view text, const std::string& who) {
  const size_t colon = text.find("://");
  if (colon == std::string_view::npos || colon == 0 || is_s3(text)) return;
  for (size_t i = 0; i < colon; ++i) {
    const char c = text[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.')) return;  // not a scheme
  }
  throw ValueError(who + ": '" + std::string(text) + "' uses the " + std::string(text.substr(0, colon)) +
                   ":// scheme, which is not supported; use a local (or shared) path, or s3://bucket/prefix for S3 "
                   "and S3-compatible stores (MinIO, Ceph: set AWS_ENDPOINT_URL)");
}

S3Url S3Url::parse(std::string_view text, const std::string& who) {
  LF_CHECK(is_s3(text), ValueError, who, ": '", std::string(text), "' is not an s3:// URL; write s3://bucket/prefix");
  const std::string_view rest = text.substr(5);
  const size_t slash = rest.find('/');
  S3Url url{std::string(rest.substr(0, slash)), slash == std::string_view::npos ? "" : std::string(rest.substr(slash + 1))};
  LF_CHECK(!url.bucket.empty(), ValueError, who, ": '", std::string(text), "' names no bucket; write s3://bucket/prefix");
  while (!url.key.empty() && url.key.back() == '/') url.key.pop_back();
  return url;
}

std::string S3Url::str() const { return "s3://" + bucket + (key.empty() ? "" : "/" + key); }

S3Url S3Url::child(const std::string& name) const { return {bucket, key.empty() ? name : key + "/" + name}; }

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// Percent-encodes all but RFC 3986's unreserved characters (and '/' in a path).
std::string encoded(std::string_view text, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// The text of the first <tag>...</tag> in xml after `from` (XML's five entities decoded), and
// where it ended; nullopt when absent.
std::optional<std::string> xml_value(const std::string& xml, const std::string& tag, size_t& from) {
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  const size_t begin = xml.find(open, from);
  if (begin == std::string::npos) return std::nullopt;
  const size_t end = xml.find(close, begin);
  if (end == std::string::npos) return std::nullopt;
  from = end + close.size();
  std::string raw = xml.substr(begin + open.size(), end - begin - open.size()), out;
  for (size_t i = 0; i < raw.size(); ++i) {
    static const std::pair<const char*, char> entities[] = {
        {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    bool replaced = false;
    for (const auto& [name, c] : entities) {
      if (raw.compare(i, std::strlen(name), name) == 0) {
        out += c;
        i += std::strlen(name) - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += raw[i];
  }
  return out;
}

struct Response {
  long status = 0;
  std::string body;          // an error answer's body (and, without a sink, the object)
  std::string transport;     // set: the request did not complete (curl's reason)
  bool retryable() const { return !transport.empty() || status >= 500 || status == 429; }
};

}  // namespace

#ifdef LF_HAVE_CURL

namespace {

void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Sink {
  std::string* body;
  const std::function<void(const char*, size_t)>* write;  // set: a 2xx answer's bytes go here
  long* status;
  CURL* handle;
};

size_t on_data(char* data, size_t size, size_t count, void* user) {
  auto* sink = static_cast<Sink*>(user);
  const size_t bytes = size * count;
  if (*sink->status == 0) curl_easy_getinfo(sink->handle, CURLINFO_RESPONSE_CODE, sink->status);
  if (sink->write && *sink->status >= 200 && *sink->status < 300) {
    (*sink->write)(data, bytes);
  } else {
    sink->body->append(data, bytes);
  }
  return bytes;
}

struct Upload {
  std::string_view bytes;
  size_t offset = 0;
};

size_t on_read(char* buffer, size_t size, size_t count, void* user) {
  auto* upload = static_cast<Upload*>(user);
  const size_t n = std::min(size * count, upload->bytes.size() - upload->offset);
  std::memcpy(buffer, upload->bytes.data() + upload->offset, n);
  upload->offset += n;
  return n;
}

}  // namespace

bool S3Client::available() { return true; }

#else

bool S3Client::available() { return false; }

#endif

S3Client S3Client::from_environment(const std::string& who) {
  LF_CHECK(available(), ValueError, who, ": this build of lightning_fabric has no libcurl (Debian: libcurl4-openssl-dev "
           "when it is built), so it cannot reach s3:// storage");
  S3Client client;
  client.access_key_ = env("AWS_ACCESS_KEY_ID");
  client.secret_key_ = env("AWS_SECRET_ACCESS_KEY");
  client.session_token_ = env("AWS_SESSION_TOKEN");
  LF_CHECK(!client.access_key_.empty() && !client.secret_key_.empty(), ValueError, who,
           ": s3:// needs credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for a "
           "server other than AWS), as for litdata and boto3");
  client.region_ = env("AWS_REGION");
  if (client.region_.empty()) client.region_ = env("AWS_DEFAULT_REGION");
  if (client.region_.empty()) client.region_ = "us-east-1";
  client.endpoint_ = env("AWS_ENDPOINT_URL_S3");
  if (client.endpoint_.empty()) client.endpoint_ = env("AWS_ENDPOINT_URL");
  if (client.endpoint_.empty()) client.endpoint_ = "https://s3." + client.region_ + ".amazonaws.com";
  LF_CHECK(client.endpoint_.rfind("http://", 0) == 0 || client.endpoint_.rfind("https://", 0) == 0, ValueError, who,
           ": AWS_ENDPOINT_URL='", client.endpoint_, "' is not an http:// or https:// URL");
  while (client.endpoint_.back() == '/') client.endpoint_.pop_back();
  return client;
}

namespace {

// One request, retried while it fails to complete or the server answers 5xx or 429.
// `write` (optional) receives a 2xx answer's bytes; `restart` runs before each retry.
Response request(const std::string& method, const std::string& url, const std::string& region,
                 const std::string& access_key, const std::string& secret_key, const std::string& session_token,
                 std::optional<std::string_view> upload, const std::function<void(const char*, size_t)>* write,
                 const std::function<void()>& restart) {
  Response response;
#ifdef LF_HAVE_CURL
  init_curl_once();
  for (int attempt = 0; attempt < S3Client::kAttempts; ++attempt) {
    if (attempt > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100) * (1 << (attempt - 1)));  // 0.1 s, 0.2 s, ... 1.6 s
      if (restart) restart();
    }
    response = Response();
    CURL* handle = curl_easy_init();
    LF_CHECK(handle != nullptr, RuntimeError, "s3: libcurl could not make a request handle");
    Sink sink{&response.body, write, &response.status, handle};
    Upload body{upload.value_or(std::string_view()), 0};
    curl_slist* headers = nullptr;
    headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!session_token.empty()) headers = curl_slist_append(headers, ("x-amz-security-token: " + session_token).c_str());
    const std::string sigv4 = "aws:amz:" + region + ":s3", user = access_key + ":" + secret_key;
    curl_easy_setopt(handle, CURLOPT_URL, url.c_str());
    curl_easy_setopt(handle, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(handle, CURLOPT_USERPWD, user.c_str());
    curl_easy_setopt(handle, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(handle, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(handle, CURLOPT_LOW_SPEED_LIMIT, 1L);  // a transfer stalled for 30 s fails (and is retried)
    curl_easy_setopt(handle, CURLOPT_LOW_SPEED_TIME, 30L);
    if (method == "PUT") {
      curl_easy_setopt(handle, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(handle, CURLOPT_READFUNCTION, on_read);
      curl_easy_setopt(handle, CURLOPT_READDATA, &body);
      curl_easy_setopt(handle, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body.bytes.size()));
    } else if (method != "GET") {
      curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, method.c_str());
    }
    const CURLcode code = curl_easy_perform(handle);
    if (code != CURLE_OK) {
      response.transport = curl_easy_strerror(code);
    } else {
      curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &response.status);
    }
    curl_slist_free_all(headers);
    curl_easy_cleanup(handle);
    if (!response.retryable()) break;
  }
#else
  (void)method, (void)url, (void)region, (void)access_key, (void)secret_key, (void)session_token, (void)upload,
      (void)write, (void)restart;
  response.transport = "this build has no libcurl";
#endif
  return response;
}

// RuntimeError for a failed response: the object, the status and the server's code and message.
void check(const Response& response, const std::string& what, const std::string& object, const std::string& endpoint) {
  if (response.transport.empty() && response.status >= 200 && response.status < 300) return;
  if (!response.transport.empty()) {
    throw RuntimeError("s3: " + what + " " + object + " at " + endpoint + " failed after " +
                       std::to_string(S3Client::kAttempts) + " tries (" + response.transport +
                       "). Check that the server runs and AWS_ENDPOINT_URL names it.");
  }
  size_t from = 0;
  const std::string code = xml_value(response.body, "Code", from).value_or("");
  from = 0;
  const std::string message = xml_value(response.body, "Message", from).value_or("");
  std::string hint;
  if (response.status == 403) hint = " Check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and the region).";
  if (code == "NoSuchBucket") hint = " The bucket does not exist: create it, or correct the URL.";
  if (code == "NoSuchKey" || response.status == 404) hint = hint.empty() ? " The object does not exist." : hint;
  throw RuntimeError("s3: " + what + " " + object + " got HTTP " + std::to_string(response.status) +
                     (code.empty() ? "" : " " + code) + (message.empty() ? "" : ": " + message) +
                     (response.retryable() ? " (after " + std::to_string(S3Client::kAttempts) + " tries)" : "") +
                     (message.empty() || message.back() != '.' || response.retryable() ? "." : "") + hint);
}

}  // namespace

std::string S3Client::get(const S3Url& url) const {
  std::string bytes;
  const std::function<void(const char*, size_t)> write = [&](const char* data, size_t size) { bytes.append(data, size); };
  const Response response = request("GET", endpoint_ + "/" + url.bucket + "/" + encoded(url.key, true), region_,
                                    access_key_, secret_key_, session_token_, std::nullopt, &write, [&] { bytes.clear(); });
  check(response, "reading", url.str(), endpoint_);
  return bytes;
}

int64_t S3Client::get_to_file(const S3Url& url, const fs::path& path) const {
  const fs::path partial = path.string() + ".part-" + std::to_string(::getpid()) + "-" +
                           std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()));
  std::ofstream out;
  int64_t size = 0;
  const auto open = [&] {
    out.close();
    out.open(partial, std::ios::binary | std::ios::trunc);
    size = 0;
    LF_CHECK(out.good(), RuntimeError, "s3: cannot write ", partial.string(), " (the local copy of ", url.str(), ")");
  };
  open();
  const std::function<void(const char*, size_t)> write = [&](const char* data, size_t bytes) {
    out.write(data, static_cast<std::streamsize>(bytes));
    size += static_cast<int64_t>(bytes);
  };
  const Response response = request("GET", endpoint_ + "/" + url.bucket + "/" + encoded(url.key, true), region_,
                                    access_key_, secret_key_, session_token_, std::nullopt, &write, open);
  out.close();
  try {
    check(response, "reading", url.str(), endpoint_);
    LF_CHECK(!out.fail(), RuntimeError, "s3: writing ", partial.string(), " (the local copy of ", url.str(),
             ") failed; is the disk full?");
  } catch (...) {
    std::error_code ignored;
    fs::remove(partial, ignored);
    throw;
  }
  fs::rename(partial, path);
  return size;
}

void S3Client::put(const S3Url& url, std::string_view bytes) const {
  const Response response = request("PUT", endpoint_ + "/" + url.bucket + "/" + encoded(url.key, true), region_,
                                    access_key_, secret_key_, session_token_, bytes, nullptr, nullptr);
  check(response, "writing", url.str(), endpoint_);
}

std::vector<S3Object> S3Client::list(const S3Url& prefix) const {
  std::vector<S3Object> objects;
  std::string token;
  for (;;) {
    // Query parameters in sorted order and encoded: the canonical request SigV4 signs.
    std::string query = (token.empty() ? "" : "continuation-token=" + encoded(token, false) + "&") +
                        "list-type=2&prefix=" + encoded(prefix.key, false);
    const Response response = request("GET", endpoint_ + "/" + prefix.bucket + "?" + query, region_, access_key_,
                                      secret_key_, session_token_, std::nullopt, nullptr, nullptr);
    check(response, "listing", prefix.str(), endpoint_);
    const std::string& xml = response.body;
    size_t from = 0;
    for (;;) {
      size_t at = from;
      auto key = xml_value(xml, "Key", at);
      if (!key) break;
      auto size = xml_value(xml, "Size", at);
      objects.push_back({*key, size ? std::stoll(*size) : 0});
      from = at;
    }
    size_t at = 0;
    const auto truncated = xml_value(xml, "IsTruncated", at);
    at = 0;
    const auto next = xml_value(xml, "NextContinuationToken", at);
    if (!truncated || *truncated != "true" || !next) break;
    token = *next;
  }
  return objects;
}

std::map<std::string, int64_t> S3Client::list_folder(const S3Url& folder) const {
  std::map<std::string, int64_t> names;
  const size_t cut = folder.key.empty() ? 0 : folder.key.size() + 1;
  for (const auto& object : list(folder.key.empty() ? folder : folder.child(""))) names[object.key.substr(cut)] = object.size;
  return names;
}

void S3Client::remove(const S3Url& url) const {
  const Response response = request("DELETE", endpoint_ + "/" + url.bucket + "/" + encoded(url.key, true), region_,
                                    access_key_, secret_key_, session_token_, std::nullopt, nullptr, nullptr);
  check(response, "removing", url.str(), endpoint_);
}

}  // namespace lightning::fabric::storage
