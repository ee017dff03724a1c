"""graphite-web served by a small threaded WSGI server (stdlib + Django only).

Run by the SYSTEM interpreter (`/usr/bin/python3 graphite_web_server.py HOST PORT MIGRATE`),
never imported by SAMM: it needs Debian's graphite-web and Django 3.2, which are not in the
project venv. Compared with `django-admin migrate` followed by `runserver`, it pays Django's
start-up once and skips runserver's system checks (about 1 s less per start), and it serves
requests concurrently (Grafana sends several at once). SIGTERM stops it cleanly.
"""
import signal
import sys
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):  # one line per request is noise in a test log
        pass


def main() -> None:
    host, port, migrate = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", run_syncdb=True, verbosity=0, skip_checks=True)
    from django.core.wsgi import get_wsgi_application

    httpd = make_server(host, port, get_wsgi_application(), server_class=_Server, handler_class=_QuietHandler)
    # shutdown() blocks until serve_forever returns: call it from another thread
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=httpd.shutdown, daemon=True).start())
    print(f"graphite-web serving on {host}:{port}", flush=True)
    httpd.serve_forever(poll_interval=0.1)
    httpd.server_close()


if __name__ == "__main__":
    main()
