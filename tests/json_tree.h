// tests/json_tree.h — write a parsed JSON tree back with js_writer, and compare two trees.
// Used by test_json.c and fuzz_json.c (reader → writer → reader round trips).
#ifndef MOET_JSON_TREE_H
#define MOET_JSON_TREE_H

// Writes node n of d (and its subtree). Integers that fit int64 are written exactly (but "-0",
// an integer whose double is -0.0, as the double, to keep its sign), every other number as the
// shortest double text; keys and strings keep their NULs.
static void jt_write_tree(js_writer *w, const js_doc *d, const js_node *n) {
    switch (n->type) {
    case JS_NULL: js_w_null(w); break;
    case JS_FALSE: js_w_bool(w, 0); break;
    case JS_TRUE: js_w_bool(w, 1); break;
    case JS_NUM:
        if (n->is_int && !(n->i64 == 0 && signbit(n->num))) js_w_int(w, n->i64);
        else js_w_num(w, n->num);
        break;
    case JS_STR: js_w_strn(w, n->str, n->len); break;
    case JS_ARR:
        js_w_arr(w);
        for (const js_node *x = js_first(n); x; x = js_after(d, n, x)) jt_write_tree(w, d, x);
        js_w_end_arr(w);
        break;
    default:
        js_w_obj(w);
        for (const js_node *k = js_first(n); k; k = js_member_next(d, n, k)) {
            js_w_keyn(w, k->str, k->len);
            jt_write_tree(w, d, k + 1);
        }
        js_w_end_obj(w);
        break;
    }
}

// 1 when x (in a) and y (in b) hold the same value: same types, same members in the same
// order, same string bytes, numbers equal as doubles with the same sign (so -0 != 0), and an
// exact integer on the left stays the same exact integer on the right. A non-integer literal
// may come back as an integer ("1.0" is written "1").
static int jt_same_tree(const js_doc *a, const js_node *x, const js_doc *b, const js_node *y) {
    if (x->type != y->type) return 0;
    switch (x->type) {
    case JS_NUM:
        if (x->is_int && (!y->is_int || x->i64 != y->i64)) return 0;
        return x->num == y->num && !signbit(x->num) == !signbit(y->num);
    case JS_STR: return x->len == y->len && memcmp(x->str, y->str, x->len) == 0;
    case JS_ARR:
    case JS_OBJ: {
        if (x->len != y->len) return 0;
        const js_node *i = js_first(x), *j = js_first(y);
        while (i && j) {
            if (!jt_same_tree(a, i, b, j)) return 0;
            i = js_after(a, x, i);
            j = js_after(b, y, j);
        }
        return !i && !j;
    }
    default: return 1;
    }
}

#endif
