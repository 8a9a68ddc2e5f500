// Test helper: a throw-away PKI for TLS tests, made with OpenSSL in a fresh temporary folder (no
// openssl binary, no fixed files): a CA, a server certificate it signed for 127.0.0.1 and
// localhost, one it signed for another address, and a second CA that signed nothing here.
// EC P-256 keys, valid from an hour ago for a day.
#pragma once

#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

namespace kvpush::testing {

/// PEM files of the test PKI (paths). Value type; the files stay until removed (see
/// TempTlsTestFiles).
struct TlsTestFiles {
  std::string dir;
  std::string ca_cert;      ///< the CA that signed server_cert and wrong_name_cert
  std::string server_cert;  ///< subjectAltName IP:127.0.0.1, DNS:localhost
  std::string server_key;
  std::string wrong_name_cert;  ///< signed by ca_cert for IP:127.0.0.2, DNS:elsewhere.invalid
  std::string wrong_name_key;
  std::string other_ca_cert;  ///< a CA no server certificate here chains to
  std::string not_pem;        ///< a file with no certificate in it
  bool ok = false;            ///< every file was written
};

namespace tls_detail {

inline EVP_PKEY* NewKey() {
  return EVP_EC_gen("P-256");
}

/// A certificate for `key` named `cn`, signed by `issuer`/`issuer_key` (null: self-signed). A
/// CA gets CA:TRUE and keyCertSign; a server certificate gets `san` and serverAuth.
inline X509* MakeCert(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key,
                      bool ca, const std::string& san, long serial) {
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), serial);
  X509_gmtime_adj(X509_getm_notBefore(x), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x), 86400);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(x, issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer != nullptr ? issuer : x, x, nullptr, nullptr, 0);
  auto add = [&](int nid, const std::string& value) {
    X509_EXTENSION* e = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    if (e != nullptr) X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
  };
  if (ca) {
    add(NID_basic_constraints, "critical,CA:TRUE");
    add(NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add(NID_basic_constraints, "CA:FALSE");
    add(NID_subject_alt_name, san);
    add(NID_ext_key_usage, "serverAuth");
  }
  X509_sign(x, issuer_key != nullptr ? issuer_key : key, EVP_sha256());
  return x;
}

inline bool WriteCert(const std::string& path, X509* x) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  const bool ok = PEM_write_X509(f, x) == 1;
  return std::fclose(f) == 0 && ok;
}

inline bool WriteKey(const std::string& path, EVP_PKEY* key) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  const bool ok = PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  return std::fclose(f) == 0 && ok;
}

}  // namespace tls_detail

/// Makes the test PKI in a new folder under /tmp. Check `ok`.
inline TlsTestFiles MakeTlsTestFiles() {
  using namespace tls_detail;
  TlsTestFiles t;
  char tmpl[] = "/tmp/kvpush-tls-test-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return t;
  t.dir = tmpl;
  t.ca_cert = t.dir + "/ca.pem";
  t.server_cert = t.dir + "/server.pem";
  t.server_key = t.dir + "/server.key";
  t.wrong_name_cert = t.dir + "/wrong-name.pem";
  t.wrong_name_key = t.dir + "/wrong-name.key";
  t.other_ca_cert = t.dir + "/other-ca.pem";
  t.not_pem = t.dir + "/not-pem.txt";
  EVP_PKEY* ca_key = NewKey();
  EVP_PKEY* other_key = NewKey();
  EVP_PKEY* server_key = NewKey();
  EVP_PKEY* wrong_key = NewKey();
  X509* ca = MakeCert(ca_key, "kvpush test CA", nullptr, nullptr, true, "", 1);
  X509* other = MakeCert(other_key, "kvpush other CA", nullptr, nullptr, true, "", 2);
  X509* server =
      MakeCert(server_key, "127.0.0.1", ca, ca_key, false, "IP:127.0.0.1,DNS:localhost", 3);
  X509* wrong = MakeCert(wrong_key, "elsewhere.invalid", ca, ca_key, false,
                         "IP:127.0.0.2,DNS:elsewhere.invalid", 4);
  t.ok = WriteCert(t.ca_cert, ca) && WriteCert(t.other_ca_cert, other) &&
         WriteCert(t.server_cert, server) && WriteKey(t.server_key, server_key) &&
         WriteCert(t.wrong_name_cert, wrong) && WriteKey(t.wrong_name_key, wrong_key);
  if (FILE* f = std::fopen(t.not_pem.c_str(), "w"); f != nullptr) {
    std::fputs("not a certificate\n", f);
    t.ok = std::fclose(f) == 0 && t.ok;
  } else {
    t.ok = false;
  }
  for (X509* x : {ca, other, server, wrong}) X509_free(x);
  for (EVP_PKEY* k : {ca_key, other_key, server_key, wrong_key}) EVP_PKEY_free(k);
  return t;
}

/// MakeTlsTestFiles() whose folder is removed when this goes out of scope. Not copyable.
class TempTlsTestFiles {
 public:
  TempTlsTestFiles() : files_(MakeTlsTestFiles()) {}
  ~TempTlsTestFiles() {
    std::error_code ec;
    if (!files_.dir.empty()) std::filesystem::remove_all(files_.dir, ec);
  }
  TempTlsTestFiles(const TempTlsTestFiles&) = delete;
  TempTlsTestFiles& operator=(const TempTlsTestFiles&) = delete;
  const TlsTestFiles& files() const { return files_; }

 private:
  TlsTestFiles files_;
};

}  // namespace kvpush::testing
