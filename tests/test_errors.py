"""The error tree's one helper: the line of an exception that says what went wrong, as farm quotes it."""

from farm.errors import message_line


def test_a_python_error_is_its_first_line():
    torch_like = RuntimeError("Dynamic control flow is not supported.\n\nfrom user code:\n  File x.py, line 3\n"
                              "For more information about this error, see: https://pytorch.org/docs/export")
    assert message_line(torch_like) == "Dynamic control flow is not supported."
    psycopg_like = OSError('connection to server at "127.0.0.1", port 1 failed: Connection refused\n'
                           "\tIs the server running on that host and accepting TCP/IP connections?")
    assert message_line(psycopg_like) == 'connection to server at "127.0.0.1", port 1 failed: Connection refused'


def test_a_line_that_only_introduces_the_rest_gives_the_last_line():
    """TVM's remote errors (the text of a real RPCError) and a quoted traceback end with the message."""
    remote = RuntimeError("RPCError: Error caught from RPC call:\ncannot find file /tmp/tmpqcow3oku/nonexistent.so")
    assert message_line(remote) == "cannot find file /tmp/tmpqcow3oku/nonexistent.so"
    traceback = ValueError('Traceback (most recent call last):\n  File "a.py", line 1, in <module>\n\n'
                           "InternalError: Check failed: (n > 0) is false  \n")
    assert message_line(traceback) == "InternalError: Check failed: (n > 0) is false"


def test_no_text_is_the_type_and_a_long_line_is_cut():
    assert message_line(KeyError()) == "KeyError"
    assert message_line(ValueError("  \n \n")) == "ValueError"
    assert message_line(ValueError("x" * 500)) == "x" * 400
    assert message_line(ValueError("x" * 500), limit=10) == "x" * 10
