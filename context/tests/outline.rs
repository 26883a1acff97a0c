//! Outlines per language.

use cachet_context::outline::{analyze, Lang};

const RUST: &str = r#"use std::fmt;

/// A point.
#[derive(Debug)]
pub struct Point<T: Copy> {
    pub x: T,
    y: T,
}

pub struct Meters(pub f64);

pub enum Shape {
    Circle(f64),
    Square { side: f64 },
    Empty,
}

pub trait Area: fmt::Debug {
    type Unit;
    const SIDES: u32;
    fn area(&self) -> f64;
    fn name(&self) -> String {
        "shape".into()
    }
}

impl Area for Shape {
    type Unit = f64;
    const SIDES: u32 = 0;
    fn area(&self) -> f64 {
        match self { Shape::Circle(r) => 3.14 * r * r, _ => 0.0 }
    }
}

impl<T: Copy> Point<T> {
    pub async fn new(x: T,
                     y: T) -> Self where T: Default {
        Point { x, y }
    }
}

pub type Pair = (Point<f64>, Point<f64>);
pub const ORIGIN_NAME: &str = "origin";
static mut COUNTER: u64 = 0;

pub mod inner {
    pub fn helper() -> u8 { 1 }
}

macro_rules! square { ($x:expr) => { $x * $x }; }

pub fn total(shapes: &[Shape]) -> f64 {
    shapes.iter().map(|s| s.area()).sum()
}
"#;

const PYTHON: &str = r#"import math
from abc import ABC, abstractmethod

MAX_SHAPES = 100
_private = 3

class Shape(ABC):
    sides: int = 0

    @abstractmethod
    def area(self) -> float:
        ...

class Circle(Shape):
    def __init__(self, r: float):
        self.r = r

    def area(self) -> float:
        return math.pi * self.r ** 2

    async def fetch(self, *args, **kw):
        pass

def total_area(shapes: list[Shape]) -> float:
    return sum(s.area() for s in shapes)
"#;

const JS: &str = r#"import fs from 'fs';
export const MAX = 10;
const helper = (a, b) => a + b;
export function load(path, opts = {}) {
  return fs.readFileSync(path);
}
function* gen() { yield 1; }
export default class Store extends Base {
  count = 0;
  static create() { return new Store(); }
  get size() { return this.count; }
  async save(item) { await helper(item, 1); }
}
module.exports = { load };
"#;

const TS: &str = r#"export interface User {
  id: number;
  name?: string;
  greet(other: User): string;
}
export type Id = string | number;
enum Color { Red, Green }
export abstract class Repo<T> implements Store {
  private items: T[] = [];
  constructor(private readonly db: Db) {}
  abstract find(id: Id): T | undefined;
  public add(item: T): void { this.items.push(item); }
}
export function makeRepo(db: Db): Repo<User> { return null as any; }
export const handler = async (req: Request): Promise<Response> => { return fetch(req); };
declare function ext(a: number): string;
namespace NS { export function f(): void {} }
"#;

const TSX: &str = r#"import React from 'react';
interface Props { title: string }
export function Header({ title }: Props): JSX.Element {
  return <h1 className="x">{title}</h1>;
}
export const Footer: React.FC<Props> = (p) => <footer>{p.title}</footer>;
"#;

const GO: &str = r#"package store

import "fmt"

const MaxSize = 10

const (
	A int = iota
	B
)

var Default = New()

type Store struct {
	items map[string]int
	Name  string
}

type Getter interface {
	Get(key string) (int, error)
}

type ID = string
type Count int

func New() *Store {
	return &Store{}
}

func (s *Store) Get(key string) (int, error) {
	return s.items[key], fmt.Errorf("x")
}

func Map[T any](xs []T, f func(T) T) []T { return xs }
"#;

#[test]
fn rust_outline_is_exact() {
    let a = analyze("src/shapes.rs", RUST);
    assert_eq!(a.lang, Some(Lang::Rust));
    let expected = "\
pub struct Point<T: Copy> {
    pub x: T,
    y: T,
}
pub struct Meters(pub f64);
pub enum Shape {
    Circle(f64),
    Square { side: f64 },
    Empty,
}
pub trait Area: fmt::Debug {
    type Unit;
    const SIDES: u32;
    fn area(&self) -> f64;
    fn name(&self) -> String;
}
impl Area for Shape {
    type Unit = f64;
    const SIDES: u32;
    fn area(&self) -> f64;
}
impl<T: Copy> Point<T> {
    pub async fn new(x: T, y: T) -> Self where T: Default;
}
pub type Pair = (Point<f64>, Point<f64>);
pub const ORIGIN_NAME: &str;
static mut COUNTER: u64;
pub mod inner {
    pub fn helper() -> u8;
}
macro_rules! square;
pub fn total(shapes: &[Shape]) -> f64;
";
    assert_eq!(a.outline, expected);
    for name in ["Point", "Shape", "Area", "total", "ORIGIN_NAME", "helper", "Circle"] {
        assert!(a.defines.iter().any(|d| d == name), "{name} not defined");
    }
    let refs: Vec<&str> = a.references.iter().map(|(n, _)| n.as_str()).collect();
    assert!(refs.contains(&"Debug") && refs.contains(&"area"), "{refs:?}");
}

#[test]
fn rust_test_modules_are_left_out() {
    let a = analyze("a.rs", "pub fn a() {}\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {}\n}\n");
    assert_eq!(a.outline, "pub fn a();\n");
}

#[test]
fn python_outline_is_exact() {
    let a = analyze("pkg/shapes.py", PYTHON);
    assert_eq!(a.lang, Some(Lang::Python));
    let expected = "\
MAX_SHAPES = ...
class Shape(ABC):
    sides: int
    @abstractmethod
    def area(self) -> float: ...
class Circle(Shape):
    def __init__(self, r: float): ...
    def area(self) -> float: ...
    async def fetch(self, *args, **kw): ...
def total_area(shapes: list[Shape]) -> float: ...
";
    assert_eq!(a.outline, expected);
    assert!(a.defines.contains(&"total_area".to_string()));
    assert!(!a.defines.contains(&"_private".to_string()));
}

fn assert_lines(path: &str, src: &str, lang: Lang, lines: &[&str]) {
    let a = analyze(path, src);
    assert_eq!(a.lang, Some(lang));
    let got: Vec<&str> = a.outline.lines().map(str::trim).collect();
    for line in lines {
        assert!(got.contains(line), "{path}: missing {line:?} in\n{}", a.outline);
    }
}

#[test]
fn javascript_outline() {
    assert_lines(
        "web/store.mjs",
        JS,
        Lang::JavaScript,
        &[
            "export const MAX;",
            "const helper = (a, b) => …;",
            "export function load(path, opts = {});",
            "function* gen();",
            "export default class Store extends Base {",
            "static create();",
            "async save(item);",
        ],
    );
}

#[test]
fn typescript_outline() {
    assert_lines(
        "src/repo.ts",
        TS,
        Lang::TypeScript,
        &[
            "export interface User {",
            "greet(other: User): string;",
            "export type Id = string | number;",
            "enum Color { Red, Green }",
            "export abstract class Repo<T> implements Store {",
            "private items: T[];",
            "abstract find(id: Id): T | undefined;",
            "public add(item: T): void;",
            "export function makeRepo(db: Db): Repo<User>;",
            "export const handler = async (req: Request): Promise<Response> => …;",
            "declare function ext(a: number): string;",
            "namespace NS {",
        ],
    );
}

#[test]
fn tsx_outline() {
    assert_lines(
        "ui/header.tsx",
        TSX,
        Lang::Tsx,
        &[
            "interface Props {",
            "title: string;",
            "export function Header({ title }: Props): JSX.Element;",
            "export const Footer: React.FC<Props> = (p) => …;",
        ],
    );
}

#[test]
fn go_outline() {
    assert_lines(
        "store/store.go",
        GO,
        Lang::Go,
        &[
            "const MaxSize",
            "const A int",
            "var Default",
            "type Store struct {",
            "Name string",
            "type Getter interface {",
            "Get(key string) (int, error)",
            "type ID = string",
            "type Count int",
            "func New() *Store",
            "func (s *Store) Get(key string) (int, error)",
            "func Map[T any](xs []T, f func(T) T) []T",
        ],
    );
}

#[test]
fn broken_syntax_degrades_to_plain_text() {
    for (path, src) in [
        ("a.rs", "pub fn broken( {\n"),
        ("a.py", "def f(:\n    pass\n"),
        ("a.ts", "export interface { x: }\n"),
        ("a.go", "package x\nfunc (\n"),
        ("a.js", "function ( {"),
    ] {
        let a = analyze(path, src);
        assert_eq!(a.lang, None, "{path}");
        assert!(a.outline.is_empty() && a.defines.is_empty() && a.references.is_empty());
    }
}

#[test]
fn other_files_are_plain_text() {
    for path in ["README.md", "Makefile", "a.rs.txt", "noext", ".rs"] {
        let a = analyze(path, "fn a() {}\n");
        assert_eq!(a.lang, None, "{path}");
    }
}

#[test]
fn hostile_nesting_does_not_crash() {
    let deep = format!("fn f() {{ let x = {}1{}; }}\n", "(".repeat(20_000), ")".repeat(20_000));
    let _ = analyze("deep.rs", &deep);
    let mods = format!("{}{}", "mod a { ".repeat(2000), "}".repeat(2000));
    let a = analyze("mods.rs", &mods);
    assert!(a.outline.lines().count() < 200);
    let long = format!("pub fn f({}) {{}}\n", "a: u8, ".repeat(1000));
    let a = analyze("long.rs", &long);
    assert!(a.outline.lines().all(|l| l.chars().count() <= 241));
}

#[test]
fn analysis_is_deterministic() {
    for (path, src) in [("a.rs", RUST), ("a.py", PYTHON), ("a.js", JS), ("a.ts", TS), ("a.tsx", TSX), ("a.go", GO)] {
        assert_eq!(analyze(path, src), analyze(path, src));
    }
}
