/* ed25519.c: Ed25519 signature checks (RFC 8032), for trust.c.
 *
 * The cryptography is Monocypher's (vendor/monocypher, 4.0.3: BSD-2-Clause or CC0, audited, no
 * dependencies): its optional Ed25519 module (SHA-512 and the check) compiled here, the core in
 * monocypher.c. Nothing in this file is ours but the wrapper.
 */
#include "../vendor/monocypher/monocypher-ed25519.c"

#include "engine.h"

int mp_ed25519_verify(const uint8_t sig[64], const uint8_t key[32], const uint8_t *msg, size_t n) {
  return crypto_ed25519_check(sig, key, msg, n) == 0;
}
