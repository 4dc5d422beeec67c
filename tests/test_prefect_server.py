def test_prefect_server_answers(prefect_api):
    import urllib.request

    with urllib.request.urlopen(prefect_api + "/health", timeout=5) as resp:
        assert resp.status == 200
