/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Kafka security of the C tools (stamp_streamer, altmark_collector): the SEGSCOPE_KAFKA_* settings
 * of segscope_kafka/settings.py, read with the same rules and the same messages (docs/security.md):
 *
 *   SEGSCOPE_KAFKA_SECURITY_PROTOCOL      PLAINTEXT (default), SSL, SASL_PLAINTEXT, SASL_SSL
 *   SEGSCOPE_KAFKA_SASL_MECHANISM         SCRAM-SHA-512 (default with SASL), SCRAM-SHA-256, PLAIN
 *   SEGSCOPE_KAFKA_SASL_USERNAME          the user name
 *   SEGSCOPE_KAFKA_SASL_PASSWORD_FILE     a file holding the password (one trailing newline ignored)
 *   SEGSCOPE_KAFKA_SSL_CA_FILE            PEM CA of the brokers' certificates (default: system store)
 *   SEGSCOPE_KAFKA_SSL_CERT_FILE / _KEY_FILE / _KEY_PASSWORD_FILE   optional client certificate
 *
 * The agent passes its environment to the tools it starts, so they log in as the agent does; a
 * secret is never an argument (ps shows arguments). A setting that cannot be used: a message
 * naming the variable and the fix, exit 2 (like a bad flag). A refusal at run time (a wrong
 * password, an unverifiable broker, a missing ACL) is kept in kafka_refusal; the tools then stop,
 * count what was not delivered, print the refusal and exit KAFKA_EXIT_REFUSED.
 */
#ifndef SEGSCOPE_KAFKA_SECURITY_H
#define SEGSCOPE_KAFKA_SECURITY_H

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <librdkafka/rdkafka.h>

#define KAFKA_EXIT_REFUSED 3
#define KAFKA_SECRET_MAX 4096
#define KAFKA_ENV "SEGSCOPE_KAFKA_"

extern char **environ;

struct kafka_security {
	char protocol[16];            /* upper case; "" before kafka_security_load */
	const char *mechanism;
	const char *username;
	char password[KAFKA_SECRET_MAX + 1];
	const char *ca_file, *cert_file, *key_file;
	char key_password[KAFKA_SECRET_MAX + 1];
	int has_key_password;
};

static struct kafka_security kafka_sec;
static char kafka_refusal[1024];   /* the first refusal's message; "" while none */
static const char *kafka_prog = "kafka";   /* the tool, for messages (kafka_security_load) */

static int kafka_sec_fail(const char *prog, const char *var, const char *value, const char *why, const char *fix)
{
	if (value)
		fprintf(stderr, "%s: %s='%s': %s; fix: %s\n", prog, var, value, why, fix);
	else
		fprintf(stderr, "%s: %s: %s; fix: %s\n", prog, var, why, fix);
	return -1;
}

static const char *kafka_env(const char *setting)
{
	char name[96];
	const char *v;

	snprintf(name, sizeof(name), KAFKA_ENV "%s", setting);
	v = getenv(name);
	while (v && (*v == ' ' || *v == '\t'))
		v++;
	return v && *v ? v : NULL;
}

/* The text of a secret file into buf (one trailing newline dropped); -1 after printing. */
static int kafka_read_secret(const char *prog, const char *var, const char *path, const char *what, char *buf)
{
	char fix[160];
	FILE *f = fopen(path, "rb");
	size_t n;

	if (!f) {
		int e = errno;

		snprintf(fix, sizeof(fix), e == ENOENT ? "point it at the file holding %s (e.g. a mounted Secret key)"
						      : "make it readable by this program's user (%s)", what);
		return kafka_sec_fail(prog, var, path, e == ENOENT ? "no such file" : strerror(e), fix);
	}
	n = fread(buf, 1, KAFKA_SECRET_MAX + 1, f);
	if (ferror(f)) {
		int e = errno;

		fclose(f);
		snprintf(fix, sizeof(fix), "point it at the file holding %s", what);
		return kafka_sec_fail(prog, var, path, e == EISDIR ? "is a directory" : strerror(e), fix);
	}
	fclose(f);
	if (n > KAFKA_SECRET_MAX) {
		snprintf(fix, sizeof(fix), "the file must hold %s only", what);
		return kafka_sec_fail(prog, var, path, "longer than 4096 bytes", fix);
	}
	if (n >= 2 && buf[n - 2] == '\r' && buf[n - 1] == '\n')
		n -= 2;
	else if (n >= 1 && buf[n - 1] == '\n')
		n -= 1;
	buf[n] = 0;
	if (n == 0) {
		snprintf(fix, sizeof(fix), "write %s into it", what);
		return kafka_sec_fail(prog, var, path, "the file is empty", fix);
	}
	if (strlen(buf) != n || strchr(buf, '\n') || strchr(buf, '\r')) {
		snprintf(fix, sizeof(fix), "the file must hold %s only, on one line", what);
		return kafka_sec_fail(prog, var, path, "holds more than one line", fix);
	}
	return 0;
}

/* Does the file at path contain marker (a PEM header)? -1 after printing. */
static int kafka_pem_file(const char *prog, const char *var, const char *path, const char *marker, const char *label,
			  const char *what)
{
	char fix[160], why[96], *data;
	FILE *f = fopen(path, "rb");
	size_t n, cap = 1 << 20;
	int found;

	snprintf(fix, sizeof(fix), "point it at %s", what);
	if (!f)
		return kafka_sec_fail(prog, var, path, errno == ENOENT ? "no such file" : strerror(errno),
				      errno == ENOENT ? fix : "make it readable by this program's user");
	data = malloc(cap + 1);
	if (!data) {
		fclose(f);
		return kafka_sec_fail(prog, var, path, "out of memory", "retry");
	}
	n = fread(data, 1, cap, f);
	fclose(f);
	data[n] = 0;
	found = memmem(data, n, marker, strlen(marker)) != NULL;
	free(data);
	if (!found) {
		snprintf(why, sizeof(why), "no PEM %s in it", label);
		snprintf(fix, sizeof(fix), "point it at %s in PEM form", what);
		return kafka_sec_fail(prog, var, path, why, fix);
	}
	return 0;
}

static int kafka_key_encrypted(const char *path)
{
	char buf[4096];
	FILE *f = fopen(path, "rb");
	size_t n;

	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	return strstr(buf, "ENCRYPTED") != NULL;
}

/* librdkafka before 2.6.1 sends a SCRAM client-final nonce that Kafka 4.x brokers refuse (fixed in
 * librdkafka 2.6.1); Debian 12 ships 2.0.2. PLAIN over TLS works with every version. */
#define KAFKA_SCRAM_FIXED 0x020601ff
#define KAFKA_SCRAM_HINT                                                                                \
	"; note: this librdkafka is older than 2.6.1, whose SCRAM Kafka 4.x brokers refuse even with the " \
	"right password: use " KAFKA_ENV "SASL_MECHANISM=PLAIN (over SASL_SSL) for this program, or "       \
	"librdkafka >= 2.6.1"

static int kafka_scram_broken(void)
{
	return kafka_sec.mechanism && !strncmp(kafka_sec.mechanism, "SCRAM", 5) && rd_kafka_version() < KAFKA_SCRAM_FIXED;
}

/* Read and check SEGSCOPE_KAFKA_*; 0, or -1 after printing the variable and the fix. */
static int kafka_security_load(const char *prog)
{
	static const char *const settings[] = {
		"SECURITY_PROTOCOL", "SASL_MECHANISM", "SASL_USERNAME", "SASL_PASSWORD_FILE",
		"SSL_CA_FILE", "SSL_CERT_FILE", "SSL_KEY_FILE", "SSL_KEY_PASSWORD_FILE",
	};
	static const char *const protocols[] = { "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL" };
	static const char *const mechanisms[] = { "SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN" };
	struct kafka_security *s = &kafka_sec;
	const char *v, *cert, *key;
	int sasl, tls, ok;
	char fix[256];

	kafka_prog = prog;
	for (char **e = environ; *e; e++) {
		const char *rest, *eq;
		size_t len;

		if (strncmp(*e, KAFKA_ENV, strlen(KAFKA_ENV)))
			continue;
		rest = *e + strlen(KAFKA_ENV);
		eq = strchr(rest, '=');
		len = eq ? (size_t)(eq - rest) : strlen(rest);
		if (strncmp(rest, "SECURITY_", 9) && strncmp(rest, "SASL_", 5) && strncmp(rest, "SSL_", 4))
			continue;
		ok = 0;
		for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++)
			ok |= strlen(settings[i]) == len && !strncmp(rest, settings[i], len);
		if (ok)
			continue;
		if (len == strlen("SASL_PASSWORD") && !strncmp(rest, "SASL_PASSWORD", len))
			return kafka_sec_fail(prog, KAFKA_ENV "SASL_PASSWORD", NULL,
					      "a secret is read from a file only (a variable's value shows in the process environment)",
					      "write the password to a file readable only by this program and set "
					      KAFKA_ENV "SASL_PASSWORD_FILE");
		fprintf(stderr, "%s: " KAFKA_ENV "%.*s: not a Kafka security setting; fix: use one of", prog, (int)len, rest);
		for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++)
			fprintf(stderr, "%s " KAFKA_ENV "%s", i ? "," : "", settings[i]);
		fputc('\n', stderr);
		return -1;
	}

	v = kafka_env("SECURITY_PROTOCOL");
	snprintf(s->protocol, sizeof(s->protocol), "%s", v ? v : "PLAINTEXT");
	for (char *p = s->protocol; *p; p++)
		*p = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
	ok = 0;
	for (size_t i = 0; i < 4; i++)
		ok |= !strcmp(s->protocol, protocols[i]) && strlen(v ? v : "PLAINTEXT") < sizeof(s->protocol);
	if (!ok)
		return kafka_sec_fail(prog, KAFKA_ENV "SECURITY_PROTOCOL", v, "unknown protocol",
				      "use one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL");
	sasl = !strncmp(s->protocol, "SASL_", 5);
	tls = strlen(s->protocol) >= 3 && !strcmp(s->protocol + strlen(s->protocol) - 3, "SSL");

	if (sasl) {
		v = kafka_env("SASL_MECHANISM");
		s->mechanism = NULL;
		for (size_t i = 0; i < 3; i++)
			if (!strcasecmp(v ? v : "SCRAM-SHA-512", mechanisms[i]))
				s->mechanism = mechanisms[i];
		if (!s->mechanism)
			return kafka_sec_fail(prog, KAFKA_ENV "SASL_MECHANISM", v, "unknown mechanism",
					      "use one of SCRAM-SHA-512, SCRAM-SHA-256, PLAIN");
		s->username = kafka_env("SASL_USERNAME");
		if (!s->username) {
			char why[96];

			snprintf(why, sizeof(why), "missing (%s logs in with a user name)", s->protocol);
			return kafka_sec_fail(prog, KAFKA_ENV "SASL_USERNAME", NULL, why,
					      "set it to the user Kafka knows this program as");
		}
		v = kafka_env("SASL_PASSWORD_FILE");
		if (!v) {
			char why[384];

			snprintf(why, sizeof(why), "missing (%s needs the password of user '%s')", s->protocol, s->username);
			return kafka_sec_fail(prog, KAFKA_ENV "SASL_PASSWORD_FILE", NULL, why,
					      "set it to the path of a file holding the password");
		}
		if (kafka_read_secret(prog, KAFKA_ENV "SASL_PASSWORD_FILE", v, "the password", s->password) < 0)
			return -1;
		if (kafka_scram_broken())
			fprintf(stderr, "%s: warning: " KAFKA_ENV "SASL_MECHANISM=%s with librdkafka %s: Kafka 4.x brokers "
				"refuse its SCRAM (fixed in librdkafka 2.6.1); PLAIN over SASL_SSL works with it\n",
				prog, s->mechanism, rd_kafka_version_str());
	} else {
		static const char *const unused[] = { "SASL_MECHANISM", "SASL_USERNAME", "SASL_PASSWORD_FILE" };

		for (size_t i = 0; i < 3; i++)
			if (kafka_env(unused[i])) {
				char var[64], why[128];

				snprintf(var, sizeof(var), KAFKA_ENV "%s", unused[i]);
				snprintf(why, sizeof(why), "set, but " KAFKA_ENV "SECURITY_PROTOCOL=%s does not use SASL", s->protocol);
				snprintf(fix, sizeof(fix), "set " KAFKA_ENV "SECURITY_PROTOCOL to SASL_SSL or SASL_PLAINTEXT, or unset %s", var);
				return kafka_sec_fail(prog, var, NULL, why, fix);
			}
	}
	if (tls) {
		s->ca_file = kafka_env("SSL_CA_FILE");
		if (s->ca_file && kafka_pem_file(prog, KAFKA_ENV "SSL_CA_FILE", s->ca_file, "-----BEGIN CERTIFICATE-----",
						 "CERTIFICATE", "the CA certificate(s) that signed the brokers' certificates") < 0)
			return -1;
		cert = kafka_env("SSL_CERT_FILE");
		key = kafka_env("SSL_KEY_FILE");
		if (!cert != !key) {
			const char *missing = key ? KAFKA_ENV "SSL_CERT_FILE" : KAFKA_ENV "SSL_KEY_FILE";

			snprintf(fix, sizeof(fix), "set %s too, or unset both", missing);
			return kafka_sec_fail(prog, missing, NULL,
					      "missing: a client certificate needs both its certificate and its key", fix);
		}
		s->cert_file = cert;
		s->key_file = key;
		v = kafka_env("SSL_KEY_PASSWORD_FILE");
		if (cert) {
			if (kafka_pem_file(prog, KAFKA_ENV "SSL_CERT_FILE", cert, "-----BEGIN CERTIFICATE-----",
					   "CERTIFICATE", "the client certificate") < 0 ||
			    kafka_pem_file(prog, KAFKA_ENV "SSL_KEY_FILE", key, "PRIVATE KEY-----",
					   "PRIVATE KEY", "the client certificate's private key") < 0)
				return -1;
			if (v) {
				if (kafka_read_secret(prog, KAFKA_ENV "SSL_KEY_PASSWORD_FILE", v, "the key's password",
						      s->key_password) < 0)
					return -1;
				s->has_key_password = 1;
			} else if (kafka_key_encrypted(key)) {
				char why[PATH_MAX + 64];

				snprintf(why, sizeof(why), "missing: the key in %s is encrypted", key);
				return kafka_sec_fail(prog, KAFKA_ENV "SSL_KEY_PASSWORD_FILE", NULL, why,
						      "set it to a file holding the key's password");
			}
		} else if (v) {
			return kafka_sec_fail(prog, KAFKA_ENV "SSL_KEY_PASSWORD_FILE", NULL, "set without a client certificate",
					      "set " KAFKA_ENV "SSL_CERT_FILE and " KAFKA_ENV "SSL_KEY_FILE, or unset it");
		}
	} else {
		static const char *const unused[] = { "SSL_CA_FILE", "SSL_CERT_FILE", "SSL_KEY_FILE", "SSL_KEY_PASSWORD_FILE" };

		for (size_t i = 0; i < 4; i++)
			if (kafka_env(unused[i])) {
				char var[64], why[128];

				snprintf(var, sizeof(var), KAFKA_ENV "%s", unused[i]);
				snprintf(why, sizeof(why), "set, but " KAFKA_ENV "SECURITY_PROTOCOL=%s does not use TLS", s->protocol);
				snprintf(fix, sizeof(fix), "set " KAFKA_ENV "SECURITY_PROTOCOL to SASL_SSL or SSL, or unset %s", var);
				return kafka_sec_fail(prog, var, NULL, why, fix);
			}
	}
	return 0;
}

static int kafka_security_uses_sasl(void) { return !strncmp(kafka_sec.protocol, "SASL_", 5); }
static int kafka_security_uses_ssl(void)
{
	size_t n = strlen(kafka_sec.protocol);

	return n >= 3 && !strcmp(kafka_sec.protocol + n - 3, "SSL");
}

/* Set the loaded settings on conf (nothing for PLAINTEXT); the secrets are wiped from memory after. */
static int kafka_security_apply(rd_kafka_conf_t *conf, const char *prog)
{
	char err[256], lower[16];
	int rc = 0;

#define KSET(k, v)                                                                                      \
	do {                                                                                            \
		if (rc == 0 && rd_kafka_conf_set(conf, k, v, err, sizeof(err)) != RD_KAFKA_CONF_OK) {   \
			fprintf(stderr, "%s: kafka config %s: %s\n", prog, k, err);                     \
			rc = -1;                                                                        \
		}                                                                                       \
	} while (0)
	if (!kafka_sec.protocol[0] || !strcmp(kafka_sec.protocol, "PLAINTEXT"))
		return 0;
	for (size_t i = 0; i <= strlen(kafka_sec.protocol); i++)
		lower[i] = (char)tolower((unsigned char)kafka_sec.protocol[i]);
	KSET("security.protocol", lower);
	if (kafka_security_uses_sasl()) {
		KSET("sasl.mechanisms", kafka_sec.mechanism);
		KSET("sasl.username", kafka_sec.username);
		KSET("sasl.password", kafka_sec.password);   /* librdkafka keeps it redacted in its logs */
	}
	if (kafka_security_uses_ssl()) {
		KSET("ssl.ca.location", kafka_sec.ca_file ? kafka_sec.ca_file : "probe");
		KSET("ssl.endpoint.identification.algorithm", "https");
		if (kafka_sec.cert_file) {
			KSET("ssl.certificate.location", kafka_sec.cert_file);
			KSET("ssl.key.location", kafka_sec.key_file);
			if (kafka_sec.has_key_password)
				KSET("ssl.key.password", kafka_sec.key_password);
		}
	}
#undef KSET
	explicit_bzero(kafka_sec.password, sizeof(kafka_sec.password));
	explicit_bzero(kafka_sec.key_password, sizeof(kafka_sec.key_password));
	return rc;
}

/* Keep (and print once) a refusal; returns 1 if err is one. `what`: the topic, when known. */
static int kafka_note_refusal(const char *prog, rd_kafka_resp_err_t err, const char *reason, const char *what)
{
	char msg[sizeof(kafka_refusal)];
	int login = err == RD_KAFKA_RESP_ERR__AUTHENTICATION || err == RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED;
	int tls_err = err == RD_KAFKA_RESP_ERR__SSL || (login && strstr(reason, "SSL") && !strstr(reason, "SASL"));
	const char *acl = err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ? "topic"
			  : err == RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED ? "cluster"
			  : err == RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED ? "transactional id"
											    : NULL;

	if (tls_err && kafka_security_uses_ssl())
		snprintf(msg, sizeof(msg),
			 "TLS with the broker failed (%s); fix: " KAFKA_ENV "SSL_CA_FILE must hold the CA that signed the "
			 "broker's certificate, and the bootstrap address must be a name or address in that certificate; a "
			 "broker that asks for a client certificate needs " KAFKA_ENV "SSL_CERT_FILE and " KAFKA_ENV
			 "SSL_KEY_FILE (docs/security.md)", reason);
	else if (tls_err)
		snprintf(msg, sizeof(msg),
			 "TLS with the broker failed (%s); fix: " KAFKA_ENV "SECURITY_PROTOCOL=%s does not speak TLS; use "
			 "SSL or SASL_SSL for a TLS listener", reason, kafka_sec.protocol);
	else if (login && kafka_security_uses_sasl())
		snprintf(msg, sizeof(msg),
			 "Kafka refused the login of user '%s' with %s (%s); fix: check " KAFKA_ENV "SASL_USERNAME, the "
			 "password in the file " KAFKA_ENV "SASL_PASSWORD_FILE names, and that the user has %s credentials "
			 "on the cluster (docs/security.md)%s", kafka_sec.username, kafka_sec.mechanism, reason,
			 kafka_sec.mechanism, kafka_scram_broken() ? KAFKA_SCRAM_HINT : "");
	else if (login)
		snprintf(msg, sizeof(msg),
			 "Kafka refused the connection (%s); fix: the listener wants a login: set " KAFKA_ENV
			 "SECURITY_PROTOCOL to SASL_SSL with " KAFKA_ENV "SASL_USERNAME and " KAFKA_ENV
			 "SASL_PASSWORD_FILE (docs/security.md)", reason);
	else if (acl)
		snprintf(msg, sizeof(msg),
			 "Kafka refused %s%s%s access to %s%s%s (%s); fix: this principal lacks the ACL: run the program with "
			 "its own role's credentials (" KAFKA_ENV "SASL_USERNAME) or grant the ACL (docs/security.md, ACLs "
			 "per role)", kafka_security_uses_sasl() ? "user '" : "this client",
			 kafka_security_uses_sasl() ? kafka_sec.username : "", kafka_security_uses_sasl() ? "'" : "",
			 what ? acl : "a ", what ? " " : acl, what ? what : "", reason);
	else
		return 0;
	if (!kafka_refusal[0]) {
		snprintf(kafka_refusal, sizeof(kafka_refusal), "%s", msg);
		fprintf(stderr, "%s: %s\n", prog, msg);
	}
	return 1;
}

/* librdkafka's error callback: refusals are kept (kafka_refusal), other errors said as before. */
static void kafka_on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	(void)rk;
	(void)opaque;
	if (!kafka_note_refusal(kafka_prog, (rd_kafka_resp_err_t)err, reason, NULL))
		fprintf(stderr, "%s: kafka: %s: %s\n", kafka_prog, rd_kafka_err2name((rd_kafka_resp_err_t)err), reason);
}

#endif /* SEGSCOPE_KAFKA_SECURITY_H */
