"""A GCS server for the gs:// tests: gcp-storage-emulator (PyPI), run in this
process on a free port, with the two XML-API answers it lacks and that
object_store's GCS client (what Tern's gs:// repositories use) needs:

* `GET /<bucket>?list-type=2&prefix=...[&delimiter=/]`: the XML object listing (the
  emulator lists only through the JSON API);
* `ETag` and `Last-Modified` on `GET /<bucket>/<object>` downloads (the
  emulator sends neither; the client requires both).

Both are answered from the emulator's own storage; everything else (the
service-account credentials, uploads, downloads, deletes) is the emulator's.
"""

import base64
import binascii
import datetime
import json
import urllib.parse
import urllib.request
from xml.sax.saxutils import escape


def _etag(obj):
    md5 = obj.get("md5Hash")
    return '"{}"'.format(binascii.hexlify(base64.b64decode(md5)).decode()) if md5 else '"{}"'.format(obj["generation"])


def _http_date(rfc3339):
    t = datetime.datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
    return t.strftime("%a, %d %b %Y %H:%M:%S GMT")


def _xml_list(request, response, storage, *args, **kwargs):
    from gcp_storage_emulator.exceptions import NotFound
    from http import HTTPStatus

    bucket = request.params["bucket_name"]
    prefix = (request.query.get("prefix") or [None])[0]
    delimiter = (request.query.get("delimiter") or [None])[0]
    try:
        files, prefixes = storage.get_file_list(bucket, prefix, delimiter, None)
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        return
    contents = "".join(
        "<Contents><Key>{}</Key><Size>{}</Size><LastModified>{}</LastModified><ETag>{}</ETag></Contents>".format(
            escape(f["name"]), f["size"], f["updated"], escape(_etag(f)))
        for f in files)
    contents += "".join("<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>".format(escape(p)) for p in prefixes)
    response.write_file(
        '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>{}</Name>{}</ListBucketResult>'.format(
            escape(bucket), contents).encode(), content_type="application/xml")


def _download_with_headers(download):
    def handler(request, response, storage, *args, **kwargs):
        download(request, response, storage, *args, **kwargs)
        if response.status.value < 300:
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
            response["ETag"] = _etag(obj)
            response["Last-Modified"] = _http_date(obj["updated"])
            response["x-goog-generation"] = obj["generation"]
    return handler


class GCS:
    """The emulator on 127.0.0.1:<free port>, a service-account key file that
    points object_store at it, and helpers filling its buckets."""

    def __init__(self, key_file):
        from gcp_storage_emulator import server

        if not getattr(server, "_tern_xml", False):
            routes = [(r"^/(?P<bucket_name>[-.\w]+)/?$", {"GET": _xml_list})]
            for regex, handlers in server.HANDLERS:
                handlers = dict(handlers)
                if handlers.get("GET") is server.objects.download and regex.startswith("^/(?P<bucket_name>"):
                    handlers["GET"] = _download_with_headers(server.objects.download)
                routes.append((regex, handlers))
            server.HANDLERS = tuple(routes)
            server._tern_xml = True
        self.server = server.create_server("127.0.0.1", 0, in_memory=True)
        self.server.start()
        port = self.server._api._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{port}"
        # What object_store reads from a service-account key for a private
        # endpoint: its base URL, and no OAuth (the emulator checks none).
        key_file.write_text(json.dumps({
            "type": "service_account", "private_key": "", "private_key_id": "", "client_email": "tern@test",
            "gcs_base_url": self.url, "disable_oauth": True}))
        self.key_file = str(key_file)

    def create_bucket(self, name):
        self._call("POST", "/storage/v1/b?project=tern", json.dumps({"name": name}).encode(), "application/json")

    def put(self, bucket, key, data):
        self._call("PUT", f"/{bucket}/{urllib.parse.quote(key)}", data, "application/octet-stream")

    def delete(self, bucket, key):
        self._call("DELETE", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(key, safe='')}")

    def _call(self, method, path, data=None, content_type=None):
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if content_type:
            req.add_header("Content-Type", content_type)
        urllib.request.urlopen(req, timeout=10).read()

    def stop(self):
        self.server.stop()
