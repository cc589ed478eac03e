/* TLS through the three callbacks: argv = CA, certificate, encrypted key, passphrase. */
#include <unistd.h>
#include "util.h"

static const char *g_ca, *g_cert, *g_key, *g_pass;
static atomic_int g_verify, g_erase, g_refuse;

static int verify(void *x509, const char *crl)
{
    const OckRpcTlsPeerCert *peer = (const OckRpcTlsPeerCert *)x509;
    CHECK(peer != NULL && peer->der != NULL && peer->len > 100);
    CHECK(peer->der[0] == 0x30); /* DER SEQUENCE */
    CHECK(crl != NULL);
    atomic_fetch_add(&g_verify, 1);
    return atomic_load(&g_refuse) ? -1 : 1;
}

static void get_ca(const char **ca, const char **crl, OckRpcTlsCertVerify *v)
{
    *ca = g_ca;
    *crl = "";
    *v = verify;
}

static void get_cert(const char **cert)
{
    *cert = g_cert;
}

static void erase(char *pass)
{
    memset(pass, 0, strlen(pass));
    free(pass);
    atomic_fetch_add(&g_erase, 1);
}

static void get_key(const char **key, char **pass, OckRpcTlsKeypassErase *e)
{
    *key = g_key;
    *pass = strdup(g_pass);
    *e = erase;
}

static void h_echo(OckRpcServerContext ctx, OckRpcMessage msg)
{
    OckRpcMessage r = {msg.data, msg.len};
    CHECK_EQ(OckRpcServerReply(ctx, 1, &r, NULL), OCK_RPC_OK);
}

static OckRpcCreateConfig tls_cfg(RpcConfigPair *pairs, int n)
{
    OckRpcCreateConfig c = make_cfg(pairs, n);
    c.mask |= OCK_RPC_CONFIG_USE_SSL_CALLBACK;
    c.getCaAndVerify = get_ca;
    c.getCert = get_cert;
    c.getPriKey = get_key;
    return c;
}

int main(int argc, char **argv)
{
    CHECK(argc == 5);
    g_ca = argv[1];
    g_cert = argv[2];
    g_key = argv[3];
    g_pass = argv[4];
    char range[32];
    int base = 25000 + (int)(getpid() % 15000);
    snprintf(range, sizeof(range), "%d-%d", base, base + 200);
    RpcConfigPair pairs[] = {{OCK_RPC_STR_COMMUNICATION_TYPE, "TCP"},
                             {OCK_RPC_STR_SERVER_PORT_RANGE, range},
                             {OCK_RPC_STR_ENABLE_TLS, "yes"}};
    OckRpcCreateConfig cfg = tls_cfg(pairs, 3);
    OckRpcServer s = 0;
    CHECK_EQ(OckRpcServerCreateWithCfg("127.0.0.1", 0, &s, &cfg), OCK_RPC_OK);
    OckRpcService svc = {1, h_echo};
    CHECK_EQ(OckRpcServerAddService(s, &svc), OCK_RPC_OK);
    CHECK_EQ(OckRpcServerStart(s), OCK_RPC_OK);
    CHECK(atomic_load(&g_erase) >= 1); /* the passphrase was erased once the key was loaded */
    char **ips;
    uint16_t *ports;
    int n;
    CHECK(OckRpcGetOobIpAndPort(s, &ips, &ports, &n));
    uint16_t port = ports[0];
    free(ips[0]);
    free(ips);
    free(ports);

    /* A TLS client: both sides' verify callbacks run, the call works. */
    RpcConfigPair cp[] = {{OCK_RPC_STR_ENABLE_TLS, "yes"}};
    OckRpcCreateConfig ccfg = tls_cfg(cp, 1);
    OckRpcClient c = 0;
    CHECK_EQ(OckRpcClientConnectWithCfg("127.0.0.1", port, &c, &ccfg), OCK_RPC_OK);
    CHECK(atomic_load(&g_verify) >= 2);
    OckRpcClientSetTimeout(c, 10000);
    OckRpcMessage req = {"secret", 6};
    char buf[16];
    OckRpcMessage rsp = {buf, sizeof(buf)};
    CHECK_EQ(OckRpcClientCall(c, 1, &req, &rsp, NULL), OCK_RPC_OK);
    CHECK(rsp.len == 6 && memcmp(buf, "secret", 6) == 0);
    OckRpcClientDisconnect(c);

    /* A plaintext client (tls "no") is refused by the TLS server. */
    cp[0].value = "no";
    OckRpcCreateConfig plain = tls_cfg(cp, 1);
    CHECK(OckRpcClientConnectWithCfg("127.0.0.1", port, &c, &plain) != OCK_RPC_OK);

    /* A verify callback that refuses: no connection. */
    atomic_store(&g_refuse, 1);
    cp[0].value = "yes";
    CHECK(OckRpcClientConnectWithCfg("127.0.0.1", port, &c, &ccfg) != OCK_RPC_OK);

    OckRpcServerDestroy(s);
    printf("tls ok\n");
    return 0;
}
