/* monocypher.c: the vendored Monocypher 4.0.3 core (vendor/monocypher, unmodified), compiled as
 * one of the engine's sources so that every build of libmlpack (make, the wheel's setup.py,
 * cross.mk, packager/emulate.py) includes it. ed25519.c uses it; its symbols stay hidden. */
#include "../vendor/monocypher/monocypher.c"
